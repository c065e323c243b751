"""Latency of the fused models on onnxruntime's CUDA execution provider, float16, side by side with the unfused
export and every other tool — what fusion is worth where it pays (on CPU every tool's output already runs at the
MatMul peak: results/latency.md).

Models (random weights, float16, torch's dynamo exporter at opset 18): BERT-base-shaped (hidden 768, 12 heads),
Llama-shaped (hidden 1024, 16 heads, 4 KV heads, RoPE), a ViT-base-shaped encoder (384-pixel images: 577
tokens), a Whisper-encoder-shaped model (1500 positions) and the Llama's decode step over a KV cache, four layers
each, at batch > 1 and lengths 512 … 4096. Variants: the export as is, onnxscript's ``optimize_for_ort``,
onnxruntime's optimizer as for CUDA (``use_gpu=True``), the same model re-exported by torch at opset 23 (torch
then writes the standard ``Attention``), and egfuse's ``ort`` and ``onnx`` targets and the ``ort`` target with
the model's opset kept (its contrib ops only). Also small models with real weights and padded masks, run on CUDA
for correctness, and attention blocks in each form the ``ort`` target can write (the calibration that fits
``egfuse/data/ort_cuda_profile.json``).

The GPU machine has no egglog, so the work is split in three:

    python experiments/bench_gpu.py prepare            # here: export, optimize, validate (CPU) → corpus/gpu/carry
    python experiments/gpu_timer.py experiments/corpus/gpu/carry "$OUT"     # there: time on CUDA (IOBinding)
    python experiments/bench_gpu.py collect GPU_RAW.json [--fit-profile]    # here: ratios (and the profile), tables

On the GPU machine, after carrying the six pieces of onnxruntime-gpu (../shared/gpu/README.md), join and install
them under a wheel name that carries the version (pip refuses ``onnxruntime_gpu-cp312-…``, the name
../shared/gpu/assemble.sh writes): ``cat piece0 … piece5 > onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
&& pip install --no-deps --target /tmp/site …``, then ``PYTHONPATH=/tmp/site python3 experiments/gpu_timer.py``
(``--only NAME …`` times some rows and checks; ``--budget`` seconds stops starting rows).

``prepare`` writes the models without their weights (``__random__`` external data, filled there), about
10 MB in all, so that they travel to the GPU machine in one device call beside the last piece of
onnxruntime-gpu (../shared/gpu/README.md). ``collect`` writes results/latency_gpu.json (``device``,
``onnxruntime``, ``ratios`` {model: {seq: {tool: ratio to the unfused export}}}, ``verdict``: the best egfuse
variant against the best other tool per row), results/latency_gpu.md, the raw timings, and with ``--fit-profile``
the CUDA profile the ``ort`` target reads for ``--provider CUDAExecutionProvider`` (the ``egfuse:ort:cuda``
variant timed is written with the profile in place when ``prepare`` ran: fit first, prepare, then time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from fingerprint import source_fingerprint

HERE = Path(__file__).parent
REPO = HERE.absolute().parent
RESULTS = HERE / "results"
CORPUS = HERE / "corpus" / "gpu"
FULL, CARRY = CORPUS / "full", CORPUS / "carry"
PROFILE = REPO / "egfuse" / "data" / "ort_cuda_profile.json"
sys.path.insert(0, str(REPO))

ORIGINAL = "original"
TOOLS = ["onnxscript", "ort", "egfuse:ort", "egfuse:onnx", "egfuse:ort:keep-opset", "egfuse:ort:cuda"]
TORCH23 = "torch opset 23"
OTHERS = ["onnxscript", "ort", TORCH23]
LAYERS, VOCAB = 4, 1000
SHAPES = {  # hidden, heads, kv heads, MLP width
    "bert": (768, 12, 12, 3072),
    "vit": (768, 12, 12, 3072),
    "whisper_encoder": (768, 12, 12, 3072),
    "llama": (1024, 16, 4, 2816),
    "llama_decode": (1024, 16, 4, 2816),
}
MODEL_TYPE = {"bert": "bert", "llama": "gpt2", "llama_decode": "gpt2", "vit": "vit", "whisper_encoder": "bart"}
ROWS = [  # (kind, batch, attention length)
    ("bert", 8, 512), ("bert", 2, 2048), ("llama", 8, 512), ("llama", 1, 4096), ("vit", 8, 577),
    ("whisper_encoder", 4, 1500), ("llama_decode", 8, 1024), ("llama_decode", 1, 4096),
]  # fmt: skip
BF16_ROWS = [("bert", 8, 512), ("llama", 8, 512)]
"""The same BERT and Llama exported in bfloat16 (rows named ``bert_bf16``, ``llama_bf16``)."""
BF16_TOOLS = ["onnxscript", "ort", "egfuse:onnx", "egfuse:ort:cuda"]
"""Tools that write something for a bfloat16 model: the ``ort`` target priced for the CPU has no bfloat16 kernel
to choose from (onnxruntime's CPU provider runs no bfloat16 model) and leaves it unchanged, saying so."""
DYNAMIC = {"bert", "llama"}
"""Exported once with symbolic batch and length; the others at each row's sizes (a ViT's patch count is its
image, a Whisper encoder's length its positions, a decode step's cache length is fixed by torch.export)."""
STRIP_ABOVE = 256
"""Float initializers with more elements than this travel without their values."""


# --- building the models ---------------------------------------------------------------------------------------


def _llama_config(hidden: int, heads: int, kv: int, mlp: int, use_cache: bool):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=LAYERS,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=8192,
                       use_cache=use_cache, attn_implementation="sdpa")  # fmt: skip


def example_inputs(kind: str, batch: int, seq: int, small: bool = False) -> dict[str, np.ndarray]:
    """The inputs a row is exported with (dynamic kinds: small ones, the dims symbolic)."""
    rng = np.random.default_rng(0)
    hidden, heads, kv, _ = SHAPES[kind]
    if kind in DYNAMIC:
        b, s = (2, 16) if not small else (batch, seq)
        return {"input_ids": rng.integers(0, VOCAB, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
    if kind == "vit":
        side = 16 * round((seq - 1) ** 0.5)
        return {"pixel_values": rng.standard_normal((batch, 3, side, side)).astype(np.float16)}
    if kind == "whisper_encoder":
        return {"input_features": rng.standard_normal((batch, 80, 2 * seq)).astype(np.float16)}
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, 1)), "attention_mask": np.ones((batch, seq), np.int64)}
    for i in range(LAYERS):
        for name in ("key", "value"):
            shape = (batch, kv, seq - 1, hidden // heads)
            feeds[f"past_{name}_{i}"] = rng.standard_normal(shape).astype(np.float16)
    return feeds


def build(kind: str, batch: int, seq: int, shapes: tuple[int, int, int, int] | None = None, dtype: str = "float16"):
    """The half-precision module (``dtype``: float16 or bfloat16), its example inputs and its output names."""
    import torch
    from transformers import BertConfig, BertModel, LlamaModel, ViTConfig, ViTModel, WhisperConfig, WhisperModel

    torch.manual_seed(0)
    hidden, heads, kv, mlp = shapes or SHAPES[kind]
    inputs = example_inputs(kind, batch, seq)
    if kind == "bert":
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=heads,
                         intermediate_size=mlp, max_position_embeddings=4096, attn_implementation="sdpa")  # fmt: skip
        inner = BertModel(cfg, add_pooling_layer=False)
    elif kind == "llama":
        inner = LlamaModel(_llama_config(hidden, heads, kv, mlp, use_cache=False))
    elif kind == "vit":
        cfg = ViTConfig(hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=heads, intermediate_size=mlp,
                        image_size=16 * round((seq - 1) ** 0.5), patch_size=16, attn_implementation="sdpa")  # fmt: skip
        inner = ViTModel(cfg, add_pooling_layer=False)
    elif kind == "whisper_encoder":
        cfg = WhisperConfig(vocab_size=VOCAB, d_model=hidden, encoder_layers=LAYERS, encoder_attention_heads=heads,
                            encoder_ffn_dim=mlp, decoder_layers=1, decoder_attention_heads=heads, num_mel_bins=80,
                            max_source_positions=seq, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            decoder_start_token_id=1, attn_implementation="sdpa")  # fmt: skip
        inner = WhisperModel(cfg).get_encoder()
    elif kind == "llama_decode":
        from corpus import cache_step

        cfg = _llama_config(hidden, heads, kv, mlp, use_cache=True)
        step, outputs = cache_step(LlamaModel(cfg).half(), cfg)
        return step.eval(), inputs, outputs
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    from bench_latency import exportable

    half = inner.to(torch.bfloat16) if dtype == "bfloat16" else inner.half()
    return exportable(half, list(inputs)), inputs, ["last_hidden_state"]


def export(
    kind: str, batch: int, seq: int, opset: int, path: Path, shapes=None, inputs=None, dtype: str = "float16"
) -> Path:
    import torch

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    model, example, outputs = build(kind, batch, seq, shapes, dtype)
    example = inputs if inputs is not None else example
    dynamic = None
    if kind in DYNAMIC:
        b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("sequence", min=2, max=8192)
        dynamic = ({0: b, 1: s}, {0: b, 1: s})
    program = torch.onnx.export(model, tuple(torch.from_numpy(np.asarray(a)) for a in example.values()),
                                input_names=list(example), output_names=outputs, dynamic_shapes=dynamic,
                                opset_version=opset, dynamo=True)  # fmt: skip
    program.save(str(path), external_data=False)
    return path


def source_name(kind: str, batch: int, seq: int, dtype: str = "float16") -> str:
    name = kind if kind in DYNAMIC else f"{kind}_b{batch}_s{seq}"
    return f"{name}_bf16" if dtype == "bfloat16" else name


def optimize(tool: str, source: Path, kind: str, out: Path, shapes: tuple | None = None) -> dict:
    """One tool on one export, in a worker process of its own (``optimize_worker.py``): its JSON record."""
    if out.exists() and (out.with_suffix(".json")).exists():
        return json.loads(out.with_suffix(".json").read_text())
    hidden, heads, _, _ = shapes or SHAPES[kind]
    cmd = [sys.executable, str(HERE / "optimize_worker.py"), tool, str(source), "--out", str(out), "--heads",
           str(heads), "--hidden", str(hidden), "--model-type", MODEL_TYPE.get(kind, "bert"), "--gpu",
           "--profile-dir", str(PROFILES)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    record = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr.strip()[-300:]}
    record.pop("model", None)
    if record.get("ok"):
        out.with_suffix(".json").write_text(json.dumps(record))
    return record


def strip(source: Path, dest: Path, weights: bool = True) -> None:
    """``source`` without its large float weights (each marked as external data at ``__random__``) and without
    the nodes' metadata."""
    import onnx

    model = onnx.load(str(source))
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    for tensor in model.graph.initializer if weights else []:
        if tensor.data_type in floats and int(np.prod(tensor.dims)) > STRIP_ABOVE:
            tensor.ClearField("raw_data")
            for field in ("float_data", "int32_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            tensor.external_data.add(key="location", value="__random__")
    for node in model.graph.node:  # the exporter's per-node stack traces: most of a weightless file
        del node.metadata_props[:]
        node.doc_string = ""
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest))


def input_spec(kind: str, batch: int, seq: int) -> dict:
    """How the GPU machine makes a row's inputs (``gpu_timer.make_inputs``)."""
    spec = {}
    for name, array in example_inputs(kind, batch, seq, small=True).items():
        item = {"shape": list(array.shape), "dtype": str(array.dtype), "kind": "float"}
        if name == "input_ids":
            item.update(kind="ids", high=VOCAB)
        elif name == "attention_mask":
            item["kind"] = "mask"
        spec[name] = item
    return spec


def tools_for(kind: str, dtype: str) -> list[str]:
    """The tools a row or check of ``kind`` in ``dtype`` is written by, its probes last."""
    model = kind if dtype == "float16" else f"{kind}_bf16"
    return (TOOLS if dtype == "float16" else BF16_TOOLS) + PROBE_TOOLS.get(model, [])


def variant_file(tool: str) -> str:
    return f"{tool.replace(':', '_').replace('+', '_')}.onnx"


def prepare_rows(log=print) -> list[dict]:
    rows, made = [], {}
    every = [(*row, "float16") for row in ROWS] + [(*row, "bfloat16") for row in BF16_ROWS]
    for kind, batch, seq, dtype in every:
        name = source_name(kind, batch, seq, dtype)
        if name not in made:
            source = export(kind, batch, seq, 18, FULL / name / "original.onnx", dtype=dtype)
            variants = {ORIGINAL: source}
            records = {}
            for tool in tools_for(kind, dtype):
                out = FULL / name / variant_file(tool)
                records[tool] = optimize(tool, source, kind, out)
                log(f"{name} {tool}: {_summary(records[tool])}")
                if records[tool].get("ok"):
                    variants[tool] = out
            try:
                variants[TORCH23] = export(kind, batch, seq, 23, FULL / name / "torch_opset23.onnx", dtype=dtype)
            except Exception as err:  # recorded, not fatal
                records[TORCH23] = {"ok": False, "error": str(err)[:300]}
            for path in variants.values():
                strip(path, CARRY / name / path.name)
            made[name] = ({t: f"{name}/{p.name}" for t, p in variants.items()}, records)
        variants, records = made[name]
        model = kind if dtype == "float16" else f"{kind}_bf16"
        rows.append({"model": model, "batch": batch, "seq": seq, "inputs": input_spec(kind, batch, seq),
                     "variants": variants, "records": records})  # fmt: skip
    return rows


def _summary(record: dict) -> str:
    return f"{record.get('seconds', 0):.1f} s, fused {record.get('fused')}" if record.get("ok") else record["error"]


CHECKS = {
    "check_bert": ("bert", (64, 4, 4, 128), 3, 12, "float16"),
    "check_llama": ("llama", (64, 4, 2, 128), 3, 12, "float16"),
    "check_bert_bf16": ("bert", (64, 4, 4, 128), 3, 12, "bfloat16"),
    "check_llama_bf16": ("llama", (64, 4, 2, 128), 3, 12, "bfloat16"),
}
"""Small models with real weights for the correctness table: kind, shapes, batch, length, dtype. The bfloat16
ones check on CUDA what validation here cannot (onnxruntime's CPU provider runs no bfloat16 model, so egfuse
judged float32 copies): the kernels' own bfloat16 rounding."""


def prepare_checks(log=print) -> list[dict]:
    """Small half-precision models with their weights and padded masks (the first row padded on the right, the
    second on the left)."""
    checks = []
    for name, (kind, shapes, batch, seq, dtype) in CHECKS.items():
        rng = np.random.default_rng(1)
        feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64)}
        feeds["attention_mask"][0, seq // 2 :] = 0  # right padding
        feeds["attention_mask"][1, : seq // 3] = 0  # left padding
        source = export(kind, batch, seq, 18, CARRY / name / "original.onnx", shapes=shapes, dtype=dtype)
        variants = {ORIGINAL: f"{name}/original.onnx"}
        for tool in tools_for(kind, dtype):
            out = CARRY / name / variant_file(tool)
            record = optimize(tool, source, kind, out, shapes)
            log(f"{name} {tool}: {_summary(record)}")
            if record.get("ok"):
                variants[tool] = f"{name}/{out.name}"
        try:
            export(kind, batch, seq, 23, CARRY / name / "torch_opset23.onnx", shapes=shapes, dtype=dtype)
            variants[TORCH23] = f"{name}/torch_opset23.onnx"
        except Exception as err:
            log(f"{name} torch opset 23: {err}")
        for rel in variants.values():  # the weights stay: these are run for their values
            strip(CARRY / rel, CARRY / rel, weights=False)
        np.savez(CARRY / name / "feeds.npz", **feeds)
        checks.append({"name": name, "feeds": f"{name}/feeds.npz", "mask": "attention_mask", "variants": variants})
    return checks


CALIBRATION = [  # name, variant, sizes: float16 blocks at the sizes GPUs run
    ("encoder B=8 S=512", {}, {"batch": 8, "seq": 512}),
    ("encoder B=2 S=2048", {}, {"batch": 2, "seq": 2048}),
    ("gqa B=8 S=512", {"kv_heads": 4, "causal": "trilu"}, {"batch": 8, "seq": 512}),
    ("gqa B=1 S=4096", {"kv_heads": 4, "causal": "trilu"}, {"batch": 1, "seq": 4096}),
    ("decode B=8 past=1024", {"past": True}, {"batch": 8, "seq": 1, "past_seq": 1023}),
    ("gqa decode B=8 past=1024", {"kv_heads": 4, "past": True}, {"batch": 8, "seq": 1, "past_seq": 1023}),
    ("gqa decode B=1 past=4096", {"kv_heads": 4, "past": True}, {"batch": 1, "seq": 1, "past_seq": 4095}),
]
CALIBRATION_WIDTH = {"heads": 16, "head_dim": 64, "k_layout": "transpose_0132", "dtype": "float16"}
BF16_CALIBRATION = ("encoder B=8 S=512", "gqa B=8 S=512", "gqa decode B=8 past=1024")
BF16_SUFFIX = " bf16"
"""Cases also timed in bfloat16 (named ``… bf16``): the same forms with every float16 tensor inside made
bfloat16 (:func:`as_bfloat16`), fitted as ``form@bfloat16`` — CUDA's kernels are not equally fast in both
types, and a form that does not load in bfloat16 is measured as not running."""

_SLOW = {"efficiency": 0.01, "overhead_us": 1000.0}
PROBES: dict[str, dict] = {
    "unfused": {"ops": {f: _SLOW for f in ("attend", "attend_z", "mha", "mha_kv4", "gqa", "packed_attention")}},
    "attend": {
        "keep_unfused": False,
        "ops": {f: _SLOW for f in ("mha", "mha_kv4", "mha@bfloat16", "mha_kv4@bfloat16", "packed_attention@bfloat16")},
    },
}
"""Choices the profile did not make, timed beside the one it made (``egfuse:ort:cuda+NAME``: the CUDA-priced
target refitted by NAME's entries): attention kept as written (what the profile chose for a decode step before
a cached step's K could be read as (B, N, T, H)), and attention as the standard op instead of the contrib ones.
They are probes, kept out of the verdict. (An earlier run's probes, results/latency_gpu_bf16_probe_raw.json:
the bfloat16 BERT ran at 0.611 of the export with MultiHeadAttention, 0.585 with packed-QKV Attention and 0.379
with packed Attention and BiasGelu, which CUDA runs in bfloat16 too.)"""
PROBE_TOOLS = {
    "llama_decode": ["egfuse:ort:cuda+unfused", "egfuse:ort:cuda+attend"],
    "bert_bf16": ["egfuse:ort:cuda+attend"],
    "llama_bf16": ["egfuse:ort:cuda+attend"],
}
PROFILES = CORPUS / "profiles"


def write_probe_profiles() -> None:
    from egfuse.commands import calibrate

    PROFILES.mkdir(parents=True, exist_ok=True)
    for name, entries in PROBES.items():
        profile = {"version": calibrate.PROFILE_VERSION, "target": "ort", **entries}
        (PROFILES / f"{name}.json").write_text(json.dumps(profile, indent=1))


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns, rounded to nearest even (numpy has no bfloat16)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _as_bfloat16_tensor(tensor) -> None:
    import onnx
    from onnx import numpy_helper

    values = numpy_helper.to_array(tensor).astype(np.float32)
    tensor.ClearField("raw_data")
    tensor.ClearField("int32_data")
    tensor.data_type = onnx.TensorProto.BFLOAT16
    tensor.raw_data = _bfloat16_bits(values).tobytes()


def as_bfloat16(model):
    """``model`` computing in bfloat16 wherever it computed in float16: float16 weights, constants and casts
    become bfloat16; its float16 inputs and outputs stay float16 (onnxruntime's Python API binds no bfloat16
    array), cast at the edges."""
    import onnx
    from onnx import helper

    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for tensor in graph.initializer:
        if tensor.data_type == f16:
            _as_bfloat16_tensor(tensor)
    filled = []  # ConstantOfShape takes bfloat16 from opset 20 only: its float16 fill is cast after it
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "ConstantOfShape" and attr.t.data_type == f16:
                filled.append(helper.make_node("Cast", [node.output[0] + "_f16"], [node.output[0]], to=bf16))
                node.output[0] += "_f16"
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == f16:
                _as_bfloat16_tensor(attr.t)
            if node.op_type == "Cast" and attr.name == "to" and attr.i == f16:
                attr.i = bf16
    del graph.value_info[:]
    renamed = {}
    entry = []
    for value in graph.input:
        if value.type.tensor_type.elem_type == f16:
            renamed[value.name] = value.name + "_bf16"
            entry.append(helper.make_node("Cast", [value.name], [renamed[value.name]], to=bf16))
    for node in graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    exits = []
    for value in graph.output:
        if value.type.tensor_type.elem_type == f16:
            inner = value.name + "_bf16"
            for node in graph.node:  # its producer and any node that reads it inside
                node.output[:] = [inner if o == value.name else o for o in node.output]
                node.input[:] = [inner if i == value.name else i for i in node.input]
            exits.append(helper.make_node("Cast", [inner], [value.name], to=f16))
    nodes = entry + list(graph.node) + exits
    for cast in filled:  # right after its ConstantOfShape
        at = next(i for i, n in enumerate(nodes) if cast.input[0] in n.output)
        nodes.insert(at + 1, cast)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def prepare_calibration(log=print) -> list[dict]:
    """Each case's block written in every form the ``ort`` target can write (``egfuse.commands.calibrate.forms``, priced
    by the uncalibrated target so the fit starts from the roofline), with the inputs it runs on."""
    from egfuse.commands import calibrate
    from egfuse.targets.ort import UNCALIBRATED

    cases = []
    for name, variant, sizes in CALIBRATION:
        case = calibrate.Case(name, {**CALIBRATION_WIDTH, **variant}, sizes)
        model, candidates, written = calibrate.forms(case, UNCALIBRATED)
        folder = "calibration/" + name.replace(" ", "_").replace("=", "")
        forms = {}
        for form, proto in written.items():
            path = CARRY / folder / f"{form}.onnx"
            path.parent.mkdir(parents=True, exist_ok=True)
            full = CORPUS / "full" / folder / f"{form}.onnx"
            full.parent.mkdir(parents=True, exist_ok=True)
            import onnx

            onnx.save(proto, str(full))
            strip(full, path)
            forms[form] = f"{folder}/{form}.onnx"
        inputs = {}
        for key, array in calibrate.feeds(model, case).items():
            kind = "mask" if key == "mask" and not np.issubdtype(array.dtype, np.floating) else "float"
            kind = "zeros" if key == "mask" and kind == "float" else kind
            inputs[key] = {"shape": list(array.shape), "dtype": str(array.dtype), "kind": kind}
        cases.append({"case": name, "inputs": inputs, "variants": forms, "candidates": candidates})
        log(f"calibration {name}: {sorted(forms)}")
        if name in BF16_CALIBRATION:  # the same forms in bfloat16: a case named after its float16 twin
            twin = {}
            for form, rel in forms.items():
                twin[form] = rel.replace(".onnx", "_bf16.onnx")
                full = CORPUS / "full" / twin[form]
                onnx.save(as_bfloat16(onnx.load(str(CORPUS / "full" / rel))), str(full))
                strip(full, CARRY / twin[form])
            cases.append({"case": name + BF16_SUFFIX, "inputs": inputs, "variants": twin, "candidates": candidates})
            log(f"calibration {name}{BF16_SUFFIX}: {sorted(twin)}")
    return cases


def prepare(args) -> int:
    write_probe_profiles()
    calibration = prepare_calibration() if args.calibration else []
    manifest = {"egfuse": source_fingerprint(), "rows": prepare_rows(), "checks": prepare_checks(),
                "calibration": calibration}  # fmt: skip
    (CARRY / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    size = sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file())
    print(f"wrote {CARRY.relative_to(REPO)} ({size / 2**20:.1f} MiB): carry it to the GPU machine")
    return 0


# --- reading the GPU machine's results back ---------------------------------------------------------------------


def ratios_of(raw: dict) -> tuple[dict, dict]:
    """Per (model, length): each variant's median over the unfused export's; and egfuse's best against the rest."""
    ratios: dict = {}
    verdict: dict = {}
    for row in raw["rows"]:
        base = row["median_ms"].get(ORIGINAL)
        if not base:
            continue
        r = {tool: round(ms / base, 3) for tool, ms in row["median_ms"].items() if tool != ORIGINAL}
        ratios.setdefault(row["model"], {})[str(row["seq"])] = r
        ours = {k: v for k, v in r.items() if k.startswith("egfuse") and "+" not in k}  # probes: not a choice
        others = {k: v for k, v in r.items() if not k.startswith("egfuse")}
        if ours and others:
            best, rival = min(ours, key=ours.get), min(others, key=others.get)
            verdict.setdefault(row["model"], {})[str(row["seq"])] = {
                "best_egfuse": best, "ratio": ours[best], "best_other": rival, "other_ratio": others[rival],
                "egfuse_vs_other": round(ours[best] / others[rival], 3),
            }  # fmt: skip
    return ratios, verdict


def fit_profile(raw: dict, manifest: dict) -> dict | None:
    """The ``ort`` target's CUDA profile: :func:`egfuse.commands.calibrate.fit` over the float16 blocks timed on the
    GPU, and for each form also timed in bfloat16 an entry ``form@bfloat16`` (:func:`typed_entries`)."""
    import onnx

    from egfuse.commands import calibrate
    from egfuse.targets.ort import UNCALIBRATED

    measured = {c["case"]: c["median_ms"] for c in raw.get("calibration", [])}
    calibration = calibrate.Calibration("ort")
    for case in manifest.get("calibration", []):
        if case["case"].endswith(BF16_SUFFIX):
            continue
        times = measured.get(case["case"], {})
        for c in case["candidates"]:
            if c["form"] in times and c.get("cost_us") is not None:
                written = onnx.load(str(CORPUS / "full" / case["variants"][c["form"]]), load_external_data=False)
                calibration.rows.append(calibrate.Measured(
                    case["case"], c["form"], c["op"], float(c["cost_us"]), times[c["form"]] * 1000,
                    float(c.get("own_us", 0.0)), float(c.get("roofline_us", 0.0)), bool(c.get("chosen")),
                    calibrate.primitive_nodes(written, c["op"]),
                ))  # fmt: skip
    if not calibration.rows:
        return None
    profile = calibrate.fit(UNCALIBRATED, calibration)
    profile["ops"].update(typed_entries(measured, profile["ops"]))
    profile.update(onnxruntime=raw["onnxruntime"], machine=raw["device"], provider="CUDAExecutionProvider")
    profile["measured_us"] = {
        case: {form: round(ms * 1000, 1) for form, ms in times.items()} for case, times in measured.items()
    }
    return profile


def typed_entries(measured: dict, ops: dict) -> dict:
    """``form@bfloat16`` for each form timed in bfloat16: its float16 efficiency times the geometric mean, over the
    blocks timed in both types, of its float16 time over its bfloat16 time (a handful of blocks, too few to fit
    a throughput and an overhead of their own; the ratio keeps the forms' order as measured). A form that did
    not load in bfloat16 gets no entry: the ``ort`` target then writes it in bfloat16 only if
    ``CUDA_BFLOAT16`` says it was seen to run."""
    ratios: dict[str, list[float]] = {}
    for case, times in measured.items():
        if not case.endswith(BF16_SUFFIX) or case.removesuffix(BF16_SUFFIX) not in measured:
            continue
        half = measured[case.removesuffix(BF16_SUFFIX)]
        for form, ms in times.items():
            if form != "unfused" and form in half and form in ops and ms > 0:
                ratios.setdefault(form, []).append(half[form] / ms)
    return {
        f"{form}@bfloat16": {
            "efficiency": round(ops[form]["efficiency"] * float(np.exp(np.mean(np.log(r)))), 4),
            "overhead_us": ops[form]["overhead_us"],
        }
        for form, r in sorted(ratios.items())
    }


COLUMNS = ["onnxscript", "ort", TORCH23, "egfuse:ort", "egfuse:onnx", "egfuse:ort:keep-opset", "egfuse:ort:cuda"]


def ratio_table(result: dict) -> str:
    """Each row's ratios to the unfused export, and egfuse's best over the best other tool's."""
    columns = COLUMNS
    lines = [
        "| model | batch | seq | " + " | ".join(columns) + " | best egfuse vs best other |",
        "|---|---|---|" + "---|" * (len(columns) + 1),
    ]
    for row in result["rows"]:
        r = result["ratios"].get(row["model"], {}).get(str(row["seq"]), {})
        v = result["verdict"].get(row["model"], {}).get(str(row["seq"]), {})
        cells = [f"{r[c]:.2f}" if c in r else "—" for c in columns]
        lines.append(f"| {row['model']} | {row['batch']} | {row['seq']} | " + " | ".join(cells)
                     + f" | {v.get('egfuse_vs_other', float('nan')):.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def markdown(result: dict) -> str:
    columns = COLUMNS
    lines = [
        f"# Latency on the GPU ({result['device']}, onnxruntime {result['onnxruntime']}, CUDA provider, float16;"
        " rows named _bf16: bfloat16)",
        "",
        "Median time of each tool's output over the unfused export's, measured side by side in one run "
        "(IOBinding, runs interleaved; lower is faster). Written by `experiments/bench_gpu.py collect`.",
        f"egfuse as of {result.get('egfuse', '?')}.",
        "",
        ratio_table(result).rstrip(),
        "",
    ]
    probes = [
        (row, tool, r)
        for row in result["rows"]
        for r in [result["ratios"].get(row["model"], {}).get(str(row["seq"]), {})]
        for tool in sorted(r)
        if "+" in tool
    ]
    if probes:
        lines += [
            "",
            "Probes: choices the CUDA profile did not make (`egfuse:ort:cuda+NAME`, the CUDA-priced target "
            "refitted by `PROBES[NAME]` in bench_gpu.py), timed beside the one it made (ratios to the unfused "
            "export).",
            "",
            "| model | batch | seq | probe | probe's ratio | egfuse:ort:cuda | egfuse:onnx |",
            "|---|---|---|---|---|---|---|",
        ]
        for row, tool, r in probes:
            cells = [f"{r[c]:.3f}" if c in r else "—" for c in (tool, "egfuse:ort:cuda", "egfuse:onnx")]
            head = f"| {row['model']} | {row['batch']} | {row['seq']} | {tool.split('+')[1]} | "
            lines.append(head + " | ".join(cells) + " |")
    lines += [
        "",
        "Correctness on CUDA (small float16 and bfloat16 models with their weights, padded masks): largest "
        "difference from the unfused model on CUDA over the positions the mask keeps (CUDA vs CPU: — where "
        "onnxruntime's CPU provider cannot run the model, bfloat16).",
        "",
        "| model | CUDA vs CPU (original) | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for check in result["checks"]:
        if "error" in check:  # the original itself did not run on CUDA
            lines.append(
                f"| {check['name']} | the original does not run: {check['error'][:80]} |" + " |" * len(columns)
            )
            continue
        d = check["max_abs_diff"]
        cells = [f"{d[c]:.2g}" if c in d else check["errors"].get(c, "—")[:40] for c in columns]
        cpu = check.get("cuda_vs_cpu_original")
        lines.append(f"| {check['name']} | {'—' if cpu is None else f'{cpu:.2g}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def collect(args) -> int:
    raw = json.loads(Path(args.raw).read_text())
    manifest = json.loads((CARRY / "manifest.json").read_text())
    ratios, verdict = ratios_of(raw)
    fused = {
        f"{r['model']} {r['seq']}": {t: rec.get("fused") for t, rec in r["records"].items()} for r in manifest["rows"]
    }
    result = {"device": raw["device"], "onnxruntime": raw["onnxruntime"], "dtype": "float16", "layers": LAYERS,
              "egfuse": manifest.get("egfuse", "?"),
              "seconds_per_row": raw.get("seconds_per_row"), "rows": [{k: r[k] for k in ("model", "batch", "seq")}
              | {"median_ms": r["median_ms"], "errors": r["errors"]} for r in raw["rows"]],
              "ratios": ratios, "verdict": verdict, "fused": fused, "checks": raw.get("checks", [])}  # fmt: skip
    result["markdown_table"] = ratio_table(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "latency_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "latency_gpu.md").write_text(markdown(result))
    (RESULTS / "latency_gpu_raw.json").write_text(json.dumps(raw, indent=1) + "\n")  # as the GPU machine wrote it
    profile = fit_profile(raw, manifest) if args.fit_profile else None
    if profile is not None:
        PROFILE.write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {PROFILE.relative_to(REPO)}")
    print((RESULTS / "latency_gpu.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("prepare", help="export, optimize and strip the models here")
    made.add_argument("--no-calibration", dest="calibration", action="store_false",
                      help="leave out the blocks the CUDA profile is fitted on (a timing run only)")  # fmt: skip
    read = sub.add_parser("collect", help="read the GPU machine's gpu_raw.json back")
    read.add_argument("raw")
    read.add_argument("--fit-profile", action="store_true", help=f"also fit {PROFILE.relative_to(REPO)} from it")
    args = parser.parse_args(argv)
    return prepare(args) if args.command == "prepare" else collect(args)


if __name__ == "__main__":
    sys.exit(main())
