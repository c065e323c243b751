"""The exporter-drift corpus: the same tiny random models exported by (transformers, torch) releases of three years.

egfuse promises that fusion survives a new exporter release; this corpus is how that is measured. For each stack
(a pinned transformers + torch + onnx + onnxscript, named by the month of its release) a virtual environment is
built from PyPI, and a fixed list of architectures — built from configs with tiny random weights, nothing
downloaded — is exported with every attention implementation (``eager``, ``sdpa``) the release offers for that
model and with both exporters of that torch release (TorchScript; dynamo: ``torch.onnx.dynamo_export`` up to
torch 2.4, ``torch.onnx.export(dynamo=True)`` from 2.5). Each export runs in its own forked child process with a
timeout; one that fails is a manifest row with its reason, never dropped. Beside each ``<name>.<exporter>.onnx``
is ``<name>.<exporter>.feeds.npz`` (one array per graph input). ``<stack>/manifest.json`` is written last: other
tools take its presence to mean the stack is complete.

    python experiments/drift_corpus.py                          # every stack, oldest first
    python experiments/drift_corpus.py --stacks 2024-06 2023-12 # some stacks
    python experiments/drift_corpus.py --stacks 2025-01 --only gpt2 llama   # re-export some architectures

The newest stack is the interpreter running this script when its versions match (the project's ``corpus``
extra), otherwise it is built like the others. This file must import and run unchanged on Python 3.11 with
transformers 4.36 … 5.x and torch 2.1 … 2.13: it guards every API difference it meets.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # stdlib and numpy only: it imports in every stack's environment

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "drift"
DEFAULT_ENVS = Path("/root/.cache/egfuse-drift/envs")


def _pins(transformers: str, torch: str, onnx: str, onnxscript: str, numpy: str = "", **extra: str) -> dict[str, str]:
    """``extra``: transitive dependencies held to the stack's month (``protobuf="<6.30"``); written as ranges, never
    bare versions, so that ``_matches`` (which compares bare versions only) does not look them up."""
    pins = {"transformers": transformers, "torch": torch, "onnx": onnx, "onnxscript": onnxscript, "numpy": numpy}
    return {**pins, **{name.replace("_", "-"): pin for name, pin in extra.items()}}


STACKS: dict[str, dict[str, str]] = {  # pip requirement per package; month = release month of the pair
    "2023-12": _pins("4.36.2", "2.1.2", "1.15.0", "0.1.0.dev20231213", "<2"),
    "2024-04": _pins("4.39.3", "2.2.2", "1.16.0", "0.1.0.dev20240402", "<2", protobuf="<5.27"),
    "2024-06": _pins("4.42.4", "2.3.1", "1.16.1", "0.1.0.dev20240615", "<2"),
    "2024-09": _pins("4.45.1", "2.4.1", "1.16.2", "0.1.0.dev20240926", "<2", protobuf="<5.29"),
    "2025-01": _pins("4.48.1", "2.5.1", "1.17.0", "0.1.0", "<2"),
    "2025-02": _pins("4.49.0", "2.6.0", "1.17.0", "0.2.0", "<2", protobuf="<6.30"),
    "2025-07": _pins("4.53.2", "2.7.1", "1.18.0", "0.2.7"),
    "2025-08": _pins("4.55.4", "2.8.0", "1.18.0", "0.4.0", protobuf="<6.33", onnx_ir="<0.1.8"),
    "2025-11": _pins("4.57.3", "2.9.1", "1.19.1", "0.5.6", protobuf="<6.34", onnx_ir="<0.1.13"),
    "2026-03": _pins("5.3.0", "2.10.0", "1.20.1", "0.6.2"),
    "2026-04": _pins("5.5.4", "2.11.0", "1.21.0", "0.7.0", protobuf="<7.35", onnx_ir="<1"),
    "2026-07": _pins("5.13.1", "2.12.1", "1.22.0", "0.7.1", protobuf="<7.36", onnx_ir="<1"),
    "2026-11": _pins("5.23.0", "2.13.0", "", "0.7.2"),
}  # fmt: skip
"""onnxscript before 0.1.0 shipped only as dated dev builds: the one of the stack's month (torch's dynamo exporter
of that time fails on later ones, e.g. 'Unsupported FX nodes: aten.rsub.Scalar' with torch 2.3 + onnxscript 0.1.0);
torch 2.7.1 exports nothing with onnxscript 0.3.2 ('The version conversion pass does not support functions') and
works with 0.2.7.

One stack per torch minor release: torch's last patch release of the minor, paired with the first transformers
minor released after it (its last patch, within about two months), the onnx and onnxscript of that month; the
stack is named by the month of the later of the two. 2.11 pairs with transformers 5.5 (April 2026), not 5.4 (March),
whose month 2026-03 is already torch 2.10's. The stacks added in November 2026 (2024-04, 2024-09, 2025-02, 2025-08,
2025-11, 2026-04, 2026-07) also hold protobuf and onnx-ir to their month: with today's protobuf 7, onnxscript up to
0.4 fails to serialize ('Field onnx.AttributeProto.i: Expected an int, got a boolean' — the 2025-01 and 2025-07
stacks lose most dynamo exports to it), and onnxscript 0.4.0 with onnx-ir 1.x exports nothing ('The model contains
functions. The version conversion pass does not support functions'). The manifest records the five main packages
only; the pins here say which protobuf / onnx-ir a stack had."""
ORDER = ["2024-06", "2023-12", "2025-01", "2025-07", "2026-03", "2026-11",
         "2025-02", "2025-08", "2025-11", "2024-09", "2024-04", "2026-04", "2026-07"]  # fmt: skip
"""Build order: the older stacks first (that is where fusion fails)."""

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB, INTER = 32, 4, 2, 2, 99, 37
BATCH, SEQ, PAST, DECODED = 2, 7, 5, 5
TIMEOUT = 300


# ---------------------------------------------------------------------------------------------------------------
# Environments


def _requirement(package: str, pin: str) -> str:
    if not pin:
        return package
    return f"{package}{pin}" if pin[0] in "<>=!~" else f"{package}=={pin}"


def _versions(python: str) -> dict[str, str]:
    code = (
        "import json, platform, importlib.metadata as m\n"
        "v = {p: m.version(p) for p in ('transformers', 'torch', 'onnx', 'onnxscript', 'numpy')}\n"
        "v['python'] = platform.python_version()\nprint(json.dumps(v))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _matches(python: str, pins: dict[str, str]) -> bool:
    try:
        have = _versions(python)
    except (subprocess.CalledProcessError, OSError, ValueError):
        return False
    return all(have[p].split("+")[0] == pin for p, pin in pins.items() if pin and pin[0].isdigit())


def build_env(stack: str, envs: Path) -> tuple[str, float]:
    """A venv with the stack's pins, made once (a ``build.json`` beside it records how long it took). torch from
    PyPI is a CUDA build: without its nvidia-* wheels ``import torch`` fails, so it is installed with them."""
    pins = STACKS[stack]
    if _matches(sys.executable, pins):
        return sys.executable, 0.0
    env = envs / stack
    python = str(env / "bin" / "python")
    record = env / "build.json"
    if record.exists() and _matches(python, pins):
        return python, json.loads(record.read_text())["seconds"]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    reqs = [_requirement(p, v) for p, v in pins.items() if p != "onnx" or v]
    subprocess.run([python, "-m", "pip", "install", "-q", *reqs], check=True)
    seconds = round(time.perf_counter() - start, 1)
    record.write_text(json.dumps({"seconds": seconds, "requirements": reqs}) + "\n")
    return python, seconds


# ---------------------------------------------------------------------------------------------------------------
# Models (this part runs inside a stack's environment)


@dataclass
class Spec:
    name: str  # architecture (and variant), without the attention implementation
    config: str
    model: str
    sizes: dict[str, Any]
    feeds: Callable[[], dict[str, np.ndarray]]
    blocks: int  # attention blocks a perfect fuser fuses
    flavour: list[str]
    heads: int = HEADS
    kv_heads: int = HEADS
    head_dim: int = HIDDEN // HEADS
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    past: bool = False  # a decoder step with a KV cache
    impls: tuple[str, ...] = ("eager", "sdpa")


@dataclass
class Entry(corpus.Entry):
    """A manifest row as the main corpus writes it, with what this stack's export needs said about it."""

    note: str | None = None  # e.g. the dynamo export fell back to static shapes


def _ids(batch: int = BATCH, seq: int = SEQ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, -2:] = 0  # padding in the last sequence
    return {"input_ids": rng.integers(3, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}


def _seq2seq() -> dict[str, np.ndarray]:
    return {**_ids(), "decoder_input_ids": np.random.default_rng(1).integers(3, VOCAB, (BATCH, DECODED))}


def _pixels() -> dict[str, np.ndarray]:
    return {"pixel_values": np.random.default_rng(0).standard_normal((BATCH, 3, 32, 32)).astype(np.float32)}


def _waveform() -> dict[str, np.ndarray]:
    return {"input_values": np.random.default_rng(0).standard_normal((BATCH, 400)).astype(np.float32)}


def _mel() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "input_features": rng.standard_normal((BATCH, 8, 32)).astype(np.float32),
        "decoder_input_ids": rng.integers(3, VOCAB, (BATCH, DECODED)).astype(np.int64),
    }


def _past_feeds(kv_heads: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, PAST + 1), np.int64)
    mask[-1, 0] = 0  # left padding in the second sequence
    feeds = {"input_ids": rng.integers(3, VOCAB, (BATCH, 1)).astype(np.int64), "attention_mask": mask}
    for i in range(LAYERS):
        for kind in ("key", "value"):
            shape = (BATCH, kv_heads, PAST, HIDDEN // HEADS)
            feeds[f"past_{kind}_{i}"] = rng.standard_normal(shape).astype(np.float32)
    return feeds


BERT = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": INTER, "max_position_embeddings": 64}  # fmt: skip
LLAMA = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
         "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 64,
         "use_cache": False}  # fmt: skip
SEQ2SEQ = {"vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
           "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "encoder_ffn_dim": INTER,
           "decoder_ffn_dim": INTER, "use_cache": False, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
           "decoder_start_token_id": 2}  # fmt: skip
GPT2 = {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 64, "n_inner": INTER}
ENC, DEC, S2S = ["mha", "padding mask"], ["mha", "causal", "padding mask"], ["mha", "causal", "cross-attention"]
ROPE_GQA = ["gqa", "causal", "rope", "padding mask"]
NOPOOL = {"add_pooling_layer": False}

SPECS: list[Spec] = [
    Spec("bert", "BertConfig", "BertModel", BERT, _ids, LAYERS, ENC, model_kwargs=NOPOOL),
    Spec("roberta", "RobertaConfig", "RobertaModel", {**BERT, "pad_token_id": 1}, _ids, LAYERS, ENC,
         model_kwargs=NOPOOL),
    Spec("distilbert", "DistilBertConfig", "DistilBertModel", {"vocab_size": VOCAB, "dim": HIDDEN, "n_layers": LAYERS,
         "n_heads": HEADS, "hidden_dim": INTER, "max_position_embeddings": 64}, _ids, LAYERS, ENC),
    Spec("deberta_v2", "DebertaV2Config", "DebertaV2Model", {**BERT, "relative_attention": True, "position_buckets": 8,
         "pos_att_type": ["p2c", "c2p"]}, _ids, LAYERS, [*ENC, "attention bias"]),
    Spec("squeezebert", "SqueezeBertConfig", "SqueezeBertModel", {**BERT, "intermediate_size": 36,
         "embedding_size": HIDDEN}, _ids, LAYERS, [*ENC, "1x1 conv projections"]),
    Spec("funnel", "FunnelConfig", "FunnelBaseModel", {"vocab_size": VOCAB, "block_sizes": [1, 1], "d_model": HIDDEN,
         "n_head": HEADS, "d_head": HIDDEN // HEADS, "d_inner": INTER, "max_position_embeddings": 64}, _ids, LAYERS,
         [*ENC, "einsum", "attention bias"]),
    Spec("vit", "ViTConfig", "ViTModel", {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
         "num_attention_heads": HEADS, "intermediate_size": INTER, "image_size": 32, "patch_size": 8,
         "num_channels": 3}, _pixels, LAYERS, ["mha", "vision"], model_kwargs=NOPOOL),
    Spec("wav2vec2", "Wav2Vec2Config", "Wav2Vec2Model", {"vocab_size": VOCAB, "hidden_size": HIDDEN,
         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INTER,
         "conv_dim": [HIDDEN, HIDDEN], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
         "num_conv_pos_embedding_groups": 4}, _waveform, LAYERS, ["mha", "speech"]),
    Spec("gpt2", "GPT2Config", "GPT2Model", {**GPT2, "use_cache": False}, _ids, LAYERS, DEC),
    Spec("gpt_neo", "GPTNeoConfig", "GPTNeoModel", {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_layers": LAYERS,
         "num_heads": HEADS, "attention_types": [[["global", "local"], 1]], "window_size": 4,
         "max_position_embeddings": 64, "intermediate_size": INTER, "use_cache": False}, _ids, LAYERS,
         [*DEC, "unscaled", "local attention"]),
    Spec("gptj", "GPTJConfig", "GPTJModel", {**GPT2, "rotary_dim": 4, "use_cache": False}, _ids, LAYERS,
         [*DEC, "rope"]),
    Spec("opt", "OPTConfig", "OPTModel", {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
         "ffn_dim": INTER, "num_attention_heads": HEADS, "max_position_embeddings": 64, "word_embed_proj_dim": HIDDEN,
         "use_cache": False}, _ids, LAYERS, DEC),
    Spec("codegen", "CodeGenConfig", "CodeGenModel", {**GPT2, "n_ctx": 64, "rotary_dim": 4, "use_cache": False}, _ids,
         LAYERS, [*DEC, "rope"]),
    Spec("llama", "LlamaConfig", "LlamaModel", LLAMA, _ids, LAYERS, ROPE_GQA, kv_heads=KV_HEADS),
    Spec("mistral", "MistralConfig", "MistralModel", {**LLAMA, "sliding_window": 4}, _ids, LAYERS,
         [*ROPE_GQA, "sliding window"], kv_heads=KV_HEADS),
    Spec("qwen2", "Qwen2Config", "Qwen2Model", LLAMA, _ids, LAYERS, ROPE_GQA, kv_heads=KV_HEADS),
    Spec("phi", "PhiConfig", "PhiModel", {**LLAMA, "partial_rotary_factor": 0.5}, _ids, LAYERS,
         [*ROPE_GQA, "partial rope"], kv_heads=KV_HEADS),
    Spec("bloom", "BloomConfig", "BloomModel", {"vocab_size": VOCAB, "hidden_size": HIDDEN, "n_layer": LAYERS,
         "n_head": HEADS, "use_cache": False}, _ids, LAYERS, [*DEC, "alibi"]),
    Spec("falcon", "FalconConfig", "FalconModel", {"vocab_size": VOCAB, "hidden_size": HIDDEN,
         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "alibi": True, "multi_query": False,
         "new_decoder_architecture": False, "use_cache": False}, _ids, LAYERS, [*DEC, "alibi"]),
    Spec("bart", "BartConfig", "BartModel", {**SEQ2SEQ, "max_position_embeddings": 64}, _seq2seq, 3 * LAYERS,
         [*S2S, "padding mask"]),
    Spec("t5", "T5Config", "T5Model", {"vocab_size": VOCAB, "d_model": HIDDEN, "d_kv": HIDDEN // HEADS, "d_ff": INTER,
         "num_layers": LAYERS, "num_heads": HEADS, "relative_attention_num_buckets": 8, "use_cache": False,
         "decoder_start_token_id": 0}, _seq2seq, 3 * LAYERS, [*S2S, "padding mask", "attention bias", "unscaled"]),
    Spec("whisper", "WhisperConfig", "WhisperModel", {**SEQ2SEQ, "num_mel_bins": 8, "max_source_positions": 16,
         "max_target_positions": 16}, _mel, 3 * LAYERS, [*S2S, "speech"]),
    Spec("gpt2_past", "GPT2Config", "GPT2Model", GPT2, lambda: _past_feeds(HEADS), LAYERS,
         [*DEC, "kv cache"], past=True),
    Spec("llama_past", "LlamaConfig", "LlamaModel", {**LLAMA, "use_cache": True}, lambda: _past_feeds(KV_HEADS),
         LAYERS, [*ROPE_GQA, "kv cache"], kv_heads=KV_HEADS, past=True),
]  # fmt: skip
ARCHITECTURES = sorted({s.name for s in SPECS})


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _build_model(spec: Spec, impl: str):
    """The model with attention implementation ``impl``. Older releases read the choice from the config and raise
    when the model lacks it; the check afterwards catches a release that silently keeps another one."""
    import transformers

    try:
        config_cls, model_cls = getattr(transformers, spec.config), getattr(transformers, spec.model)
    except (AttributeError, ImportError, RuntimeError) as err:
        raise NotInRelease(f"{spec.model} is not in transformers {transformers.__version__}") from err
    config = config_cls(**spec.sizes, attn_implementation=impl)
    try:
        model = model_cls(config, **spec.model_kwargs).eval()
    except ValueError as err:
        if "does not support" not in str(err):
            raise
        raise NotInRelease(str(err).split(". ")[0]) from err
    got = getattr(model.config, "_attn_implementation", None)
    if got is None and impl != "eager":
        raise NotInRelease(f"transformers {transformers.__version__} has no attn_implementation")
    if got is not None and got != impl:
        raise NotInRelease(f"{spec.model} ignores attn_implementation={impl!r} (uses {got!r})")
    return model, config


class NotInRelease(Exception):
    """The architecture or attention implementation does not exist in this release: a row, not a crash."""


def _wrapper(spec: Spec, model, config, names: list[str]):
    """Positional export arguments → the keyword call every transformers release accepts."""
    import torch
    import transformers

    five = _major_minor(transformers.__version__)[0] >= 5

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.cache_object = False  # legacy (key, value) tuples until the release refuses them

        def forward(self, *args):
            kwargs = {n: args[i] for i, n in enumerate(names)}  # torch 2.1 dynamo cannot trace zip(strict=)
            if not spec.past:
                return self.model(**kwargs).last_hidden_state
            past = [kwargs.pop(f"past_{k}_{i}") for i in range(LAYERS) for k in ("key", "value")]
            if five or self.cache_object:
                cache = _cache(past, config)
            else:
                cache = tuple((past[2 * i], past[2 * i + 1]) for i in range(LAYERS))
            out = self.model(**kwargs, past_key_values=cache, use_cache=True)
            return (out.last_hidden_state, *_present(out.past_key_values))

    return Wrapper().eval()


def _cache(past: list, config):
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:
        cache = DynamicCache()
    for i in range(LAYERS):
        cache.update(past[2 * i], past[2 * i + 1], i)
    return cache


def _present(cache) -> list:
    if hasattr(cache, "layers"):  # transformers 5
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    if hasattr(cache, "key_cache"):
        return [t for i in range(LAYERS) for t in (cache.key_cache[i], cache.value_cache[i])]
    return [t for layer in cache for t in layer[:2]]  # legacy tuple of (key, value)


def _dynamic_axes(name: str, array: np.ndarray, past: bool) -> dict[int, str]:
    if name.startswith("past_"):
        return {0: "batch", 2: "past_sequence"}
    if array.ndim != 2 or name == "input_values":
        return {0: "batch"}
    if name.startswith("decoder"):
        return {0: "batch", 1: "decoder_sequence"}
    return {0: "batch", 1: "total_sequence" if name == "attention_mask" and past else "sequence"}


_quiet_fds = corpus._quiet_fds  # the TorchScript exporter prints from C++, past redirect_stdout


def _export_dynamo(model, args: tuple, names: list[str], outputs: list[str], axes: dict, path: Path) -> str | None:
    """The dynamo exporter of this torch release, with dynamic shapes; static shapes when those fail (noted)."""
    import torch

    if _major_minor(torch.__version__) < (2, 5):
        options = torch.onnx.ExportOptions
        try:
            torch.onnx.dynamo_export(model, *args, export_options=options(dynamic_shapes=True)).save(str(path))
            return None
        except Exception as err:
            first = _reason(err)
        torch.onnx.dynamo_export(model, *args, export_options=options(dynamic_shapes=False)).save(str(path))
        return f"static shapes (dynamic failed: {first})"
    auto = getattr(torch.export.Dim, "AUTO", None)
    dims = {
        "batch": torch.export.Dim("batch", min=1, max=64),
        **{d: torch.export.Dim(d, min=2, max=60) for d in ("sequence", "decoder_sequence")},
        "past_sequence": torch.export.Dim("past_sequence", min=1, max=60),
    }
    if auto is not None:
        dims["total_sequence"] = auto
    try:
        if "total_sequence" not in dims and any("total_sequence" in a.values() for a in axes.values()):
            raise ValueError("torch.export.Dim.AUTO is missing: the mask's length past + new cannot be stated")
        dyn = (tuple({axis: dims[d] for axis, d in axes[n].items()} for n in names),)
        return _export_opset(model, args, path, names, outputs, {"dynamic_shapes": dyn})
    except Exception as err:  # retried without dynamic shapes, reason noted
        first = _reason(err)
    note = _export_opset(model, args, path, names, outputs, {})
    return "; ".join(filter(None, [f"static shapes (dynamic failed: {first})", note]))


def _export_opset(model, args: tuple, path: Path, names: list[str], outputs: list[str], extra: dict) -> str | None:
    """``torch.onnx.export(dynamo=True)`` at opset 18; at the release's own opset where converting to 18 fails
    (torch 2.7 with onnxscript 0.3: 'The version conversion pass does not support functions'; from onnxscript 0.4
    that message is the cause of a generic ``PassError``, hence the walk down the causes)."""
    import torch

    common = {"input_names": names, "output_names": outputs, "dynamo": True, **extra}
    try:
        torch.onnx.export(model, args, str(path), opset_version=18, **common)
        return None
    except Exception as err:
        cause: BaseException | None = err
        while cause is not None and "version conversion" not in str(cause):
            cause = cause.__cause__
        if cause is None:
            raise
    torch.onnx.export(model, args, str(path), **common)
    return "the exporter's default opset (conversion to 18 fails on functions)"


def _keyed_by_graph_inputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds under the exported graph's own input names: ``torch.onnx.dynamo_export`` ignores ``input_names``
    and calls them ``l_args_0_``, … (in argument order); the graph is kept as exported."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    if names == list(feeds):
        return feeds
    if len(names) != len(feeds):
        raise ValueError(f"graph inputs {names} do not match the {len(feeds)} feeds {list(feeds)}")
    return dict(zip(names, feeds.values(), strict=True))


def _reason(err: BaseException) -> str:
    """The error's last line that names an error, from the innermost cause (the dynamo exporter wraps the real
    reason in a generic 'Failed to export the model to ONNX')."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if "Error" in line or "not supported" in line), "")
    return f"{type(err).__name__}: {(summary or (lines[0] if lines else ''))[:300]}"


def export(spec: Spec, impl: str, exporter: str, out_dir: Path) -> Entry:
    import torch

    name = f"{spec.name}_{impl}"
    entry = Entry(name, exporter, None, spec.blocks, spec.flavour, spec.heads, spec.kv_heads, spec.head_dim)
    start = time.perf_counter()
    path = out_dir / f"{name}.{exporter}.onnx"
    try:
        torch.manual_seed(0)
        model, config = _build_model(spec, impl)
        feeds = spec.feeds()
        names = list(feeds)
        outputs = ["last_hidden_state"]
        if spec.past:
            outputs += [f"present_{k}_{i}" for i in range(LAYERS) for k in ("key", "value")]
        wrapper = _wrapper(spec, model, config, names)
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        if spec.past:  # a release that wants a Cache object says so on an eager call
            try:
                with torch.no_grad():
                    wrapper(*args)
            except (ValueError, AttributeError) as err:  # 4.48/4.49 llama: "'tuple' … no attribute 'get_seq_length'"
                if "Cache" not in str(err) and "get_seq_length" not in str(err):
                    raise
                wrapper.cache_object = True
        axes = {n: _dynamic_axes(n, feeds[n], spec.past) for n in names}
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_fds():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                kwargs = {"dynamo": False} if _major_minor(torch.__version__) >= (2, 5) else {}  # no such kwarg before
                torch.onnx.export(wrapper, args, str(path), input_names=names, output_names=outputs,
                                  dynamic_axes=axes, opset_version=17, **kwargs)  # fmt: skip
            else:
                entry.note = _export_dynamo(wrapper, args, names, outputs, axes, path)
        feeds = _keyed_by_graph_inputs(path, feeds)
        entry.file = path.name
        entry.inputs = {n: {"shape": list(v.shape), "dtype": str(v.dtype)} for n, v in feeds.items()}
        np.savez(out_dir / f"{name}.{exporter}.feeds.npz", **feeds)
    except Exception as err:
        entry.error = _reason(err)
        if not isinstance(err, NotInRelease):
            traceback.print_exc(limit=3, file=sys.stderr)
        path.unlink(missing_ok=True)
    entry.export_seconds = round(time.perf_counter() - start, 2)
    return entry


def _run_forked(job: Callable[[], Entry], fallback: Entry, timeout: float) -> Entry:
    """Run one export in a forked child (torch and transformers already imported by the parent): a crash or
    hang there costs one row, not the stack."""
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            Path(result).write_text(json.dumps(asdict(job())))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    status = None
    while time.perf_counter() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        fallback.error = f"timeout: no export after {timeout:.0f} s"
    text = Path(result).read_text()
    os.unlink(result)
    if text:
        return Entry(**json.loads(text))
    if fallback.error is None:
        fallback.error = f"export process died (wait status {status})"
    fallback.export_seconds = round(time.perf_counter() - start, 2)
    return fallback


def export_stack(stack: str, out_dir: Path, only: list[str] | None, timeout: float, build_seconds: float) -> int:
    """Export every (architecture, implementation, exporter) of this interpreter's stack into ``out_dir``."""
    import onnx  # noqa: F401 - imported before forking, like torch and transformers
    import torch
    import transformers

    torch.set_num_threads(1)
    for spec in SPECS:  # resolve the lazy modules once, in the parent
        with contextlib.suppress(Exception):
            getattr(transformers, spec.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [s for s in SPECS if not only or s.name in only]
    jobs = [(s, i, e) for s in specs for i in s.impls for e in ("torchscript", "dynamo")]
    entries = []
    for n, (spec, impl, exporter) in enumerate(jobs, 1):
        fallback = Entry(f"{spec.name}_{impl}", exporter, None, spec.blocks, spec.flavour, spec.heads,
                         spec.kv_heads, spec.head_dim)  # fmt: skip
        print(f"[{stack} {n:>3}/{len(jobs)}] {fallback.name:<22} {exporter:<11}", end=" ", flush=True)
        entry = _run_forked(lambda s=spec, i=impl, e=exporter: export(s, i, e, out_dir), fallback, timeout)
        state = "ok" if entry.error is None else f"FAILED: {entry.error[:160]}"
        print(state, f"({entry.export_seconds}s)", f"[{entry.note[:80]}]" if entry.note else "", flush=True)
        entries.append(entry)
    path = out_dir / "manifest.json"
    rows = [asdict(e) for e in entries]
    if only and path.exists():  # a partial re-export replaces its rows and keeps the others
        fresh = {(r["name"], r["exporter"]) for r in rows}
        rows = [r for r in json.loads(path.read_text())["models"] if (r["name"], r["exporter"]) not in fresh] + rows
    import importlib.metadata as metadata

    manifest = {
        "stack": stack,
        **{p: metadata.version(p) for p in ("transformers", "torch", "onnx", "onnxscript", "numpy")},
        "python": platform.python_version(),
        "env_build_seconds": build_seconds,
        "export_seconds": round(sum(e.export_seconds for e in entries), 1),
        "hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "layers": LAYERS,
        "models": rows,
    }  # fmt: skip
    path.write_text(json.dumps(manifest, indent=1) + "\n")  # last: its presence means the stack is complete
    ok = sum(e.error is None for e in entries)
    print(f"{stack}: {ok}/{len(entries)} exported → {path}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stacks", nargs="*", default=ORDER, choices=list(STACKS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--envs", type=Path, default=DEFAULT_ENVS)
    parser.add_argument("--only", nargs="*", help="architectures (default: all)", choices=ARCHITECTURES)
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per export")
    parser.add_argument("--build-only", action="store_true", help="build the environments, export nothing")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the stack this interpreter is (internal)
    parser.add_argument("--build-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        return export_stack(args.inside, args.out / args.inside, args.only, args.timeout, args.build_seconds)
    for stack in args.stacks:
        start = time.perf_counter()
        python, seconds = build_env(stack, args.envs)
        print(f"{stack}: environment {python} ({seconds} s to build)", flush=True)
        if args.build_only:
            continue
        command = [python, str(Path(__file__).resolve()), "--inside", stack, "--out", str(args.out),
                   "--timeout", str(args.timeout), "--build-seconds", str(seconds)]  # fmt: skip
        if args.only:
            command += ["--only", *args.only]
        with tempfile.TemporaryDirectory() as scratch:  # the exporters drop reports (*.sarif) into the cwd
            subprocess.run(command, check=True, cwd=scratch)
        print(f"{stack}: done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
