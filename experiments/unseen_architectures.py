"""Architectures egfuse was never developed on: transformers model types outside every corpus, exported fresh and fused.

Each model type is built from its config at tiny sizes (random weights, nothing downloaded: hidden 32, 4 query
heads, 2 layers; decoders with 2 K/V heads of 8), exported by torch's dynamo exporter (opset 18; batch symbolic, and
the sequence too where the model allows it) and fused for every egfuse target with validation on the export's own
feeds. Decoders and text encoders get a padded mask (left padding for decoders), vision models pixels, speech
models a waveform, encoder-decoders both sides. SDPA attention where the model has it, eager otherwise. What is
counted per target: attention blocks fused (of the regions found), norms and activations, rotations, and whether
validation passed. Softmaxes that are not attention (a router's, a convolution kernel's) are regions egfuse
reports and keeps; the table says how many a model has.

    python experiments/unseen_architectures.py                 # export (cached under --out) and fuse
    python experiments/unseen_architectures.py --types glm qwen3 vitdet
    python experiments/unseen_architectures.py --dtype float16    # all of them again in float16 (~9 min)

Writes experiments/results/unseen_architectures.{json,md} (``--dtype float16``: ``unseen_architectures_fp16``:
the model and its float feeds in float16, what a GPU serves; its norms and softmax then compute in float32
between casts, as transformers writes them). Needs the ``corpus`` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

DECODERS = [
    "apertus", "arcee", "bitnet", "cohere", "doge", "ernie4_5", "exaone4", "falcon_h1", "gemma3_text", "glm", "glm4",
    "gpt_neox", "granite", "helium", "hunyuan_v1_dense", "jetmoe", "lfm2", "modernbert", "nemotron", "olmo", "olmo2",
    "olmo3", "phi3", "qwen3", "seed_oss", "smollm3", "stablelm", "starcoder2",
]  # fmt: skip
"""Decoder model types in none of egfuse's corpora (tests/data, the drift corpus, held-out, producers) when this
was first run."""
MOE_AND_HYBRID = [
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "phimoe", "glm4_moe", "hunyuan_v1_moe",
    "ernie4_5_moe", "gpt_oss", "deepseek_v3", "minimax", "jamba", "qwen3_next", "persimmon", "phi", "cohere2",
    "ministral", "recurrent_gemma", "falcon_mamba", "biogpt", "xglm",
]  # fmt: skip
"""A third run: mixture-of-experts decoders (their experts as batched MatMuls, the export-friendly implementation
transformers has; each layer's router is a softmax that is not attention), hybrids of attention with recurrent or
linear-attention layers, and decoders probed later. gpt-oss was among them when it first failed (its sinks and its
rotation; now a held-out export)."""
_LABELS = {
    **dict.fromkeys(("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "phimoe", "glm4_moe",
                     "hunyuan_v1_moe", "ernie4_5_moe", "gpt_oss", "deepseek_v3"), "decoder, MoE"),
    **dict.fromkeys(("minimax", "jamba", "qwen3_next"), "hybrid, MoE"),
    **dict.fromkeys(("recurrent_gemma", "falcon_mamba"), "recurrent"),
}  # fmt: skip
"""The table's family column for the third run's types (the others are decoders)."""
_MLA = dict(
    kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, head_dim=4, v_head_dim=8,
    num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    first_k_dense_replace=1, n_shared_experts=1,
)  # fmt: skip
"""DeepSeek's multi-head latent attention at tiny sizes (its defaults are a 671B model's): Q and K are 12 wide
(8 without rotation, 4 rotated), V 8."""
_BLOCKS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
"""The encoder stack every family shares: hidden 32, 2 layers of 4 heads."""
_TEXT = {**_BLOCKS, "vocab_size": 99, "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2}  # fmt: skip
_VISION = {**_BLOCKS, "image_size": 32, "patch_size": 8, "num_channels": 3}
_SPEECH = {**_BLOCKS, "conv_dim": (32, 32), "conv_stride": (5, 4), "conv_kernel": (10, 8),
           "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}  # fmt: skip
_SEQ2SEQ = dict(
    vocab_size=99,
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
)
_T5 = dict(
    vocab_size=99,
    d_model=32,
    d_kv=8,
    num_heads=4,
    num_layers=1,
    num_decoder_layers=1,
    d_ff=64,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
_SWIN = dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2, image_size=32, patch_size=4)
OTHERS: dict[str, tuple[str, dict]] = {  # model type → (family, its config at tiny sizes)
    # vision: pixels (2, 3, H, W)
    "dinov2": ("vision", _VISION), "dinov2_with_registers": ("vision", _VISION), "deit": ("vision", _VISION),
    "beit": ("vision", {**_VISION, "use_relative_position_bias": True}),
    "data2vec-vision": ("vision", {**_VISION, "use_relative_position_bias": True}),
    "vit_msn": ("vision", _VISION), "ijepa": ("vision", _VISION), "clip_vision_model": ("vision", _VISION),
    "siglip_vision_model": ("vision", _VISION), "swin": ("vision", _SWIN), "swinv2": ("vision", _SWIN),
    "yolos": ("vision", {**_VISION, "image_size": [32, 32], "num_detection_tokens": 4}),
    "levit": ("vision", {"image_size": 64}), "segformer": ("vision", {"image_size": 64}),
    "pvt_v2": ("vision", {"image_size": 64}),
    "hiera": ("vision", {"image_size": [64, 64], "embed_dim": 16, "num_heads": [1, 2, 4, 8], "depths": [1, 1, 1, 1]}),
    "vitdet": ("vision", {**_VISION, "window_size": 2, "window_block_indices": [0],
                          "use_relative_position_embeddings": True}),
    "sam_vision_model": ("vision", {"hidden_size": 32, "output_channels": 16, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "image_size": 64, "patch_size": 8, "mlp_dim": 64,
                                    "window_size": 2, "global_attn_indexes": [1], "use_rel_pos": True}),
    # speech: a waveform (2, 1600)
    "hubert": ("speech", _SPEECH), "wavlm": ("speech", _SPEECH), "wav2vec2-conformer": ("speech", _SPEECH),
    "data2vec-audio": ("speech", _SPEECH), "unispeech": ("speech", _SPEECH), "sew": ("speech", _SPEECH),
    "sew-d": ("speech", _SPEECH),
    # text encoders: token ids and a padded mask
    "electra": ("encoder", {**_TEXT, "embedding_size": 32}), "albert": ("encoder", {**_TEXT, "embedding_size": 32}),
    "mpnet": ("encoder", _TEXT), "convbert": ("encoder", _TEXT), "roformer": ("encoder", _TEXT),
    "esm": ("encoder", {**_TEXT, "position_embedding_type": "rotary"}), "xlm-roberta": ("encoder", _TEXT),
    "camembert": ("encoder", _TEXT), "ernie": ("encoder", _TEXT), "megatron-bert": ("encoder", _TEXT),
    "rembert": ("encoder", {**_TEXT, "input_embedding_size": 32, "output_embedding_size": 32}),
    "data2vec-text": ("encoder", _TEXT), "ibert": ("encoder", _TEXT),
    "luke": ("encoder", {**_TEXT, "entity_vocab_size": 10, "entity_emb_size": 32}),
    "big_bird": ("encoder", {**_TEXT, "attention_type": "original_full"}), "canine": ("encoder", _TEXT),
    "nystromformer": ("encoder", _TEXT),
    # encoder-decoders: both sides' tokens
    "pegasus": ("seq2seq", _SEQ2SEQ), "marian": ("seq2seq", _SEQ2SEQ), "mbart": ("seq2seq", _SEQ2SEQ),
    "m2m_100": ("seq2seq", _SEQ2SEQ), "blenderbot": ("seq2seq", _SEQ2SEQ), "blenderbot-small": ("seq2seq", _SEQ2SEQ),
    "plbart": ("seq2seq", _SEQ2SEQ), "mt5": ("seq2seq", _T5), "umt5": ("seq2seq", _T5), "longt5": ("seq2seq", _T5),
}  # fmt: skip
"""Vision, speech, text-encoder and encoder-decoder model types in none of the corpora, added in a second run."""
TYPES = [*DECODERS, *OTHERS, *MOE_AND_HYBRID]
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=64, head_dim=8, pad_token_id=None, bos_token_id=None,
             eos_token_id=None)  # fmt: skip
TARGETS = ("ort", "onnx", "npu")
SUFFIX = {"float32": "", "float16": "_fp16"}
"""The export's and the results' name suffix per dtype."""


def export(model_type: str, out: Path, dtype: str = "float32") -> Path | str:
    """The export's path, or why it could not be made."""
    path = out / f"{model_type}.dynamo{SUFFIX[dtype]}.onnx"
    if path.exists():
        return path
    import torch

    family, sizes = OTHERS.get(model_type, ("decoder", {**SIZES, **(_MLA if model_type == "deepseek_v3" else {})}))
    try:
        model = _model(model_type, sizes)
        torch.manual_seed(0)
        inputs, dims = _inputs(family, sizes)
        if dtype == "float16":
            model = model.half()
            inputs = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in inputs.items()}
        names = list(inputs)

        class Hidden(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, *values):
                given = dict(zip(names, values, strict=True))
                if family in ("decoder", "encoder", "seq2seq"):
                    given["use_cache"] = False
                return self.model(**given, return_dict=True).last_hidden_state

        args = tuple(torch.from_numpy(v) for v in inputs.values())
        kwargs = {"input_names": names, "output_names": ["last_hidden_state"], "dynamo": True, "optimize": False}
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                shapes = (tuple(dims[n] for n in names),)  # one entry: forward's *values
                torch.onnx.export(Hidden(model), args, path, dynamic_shapes=shapes, **kwargs)
            except Exception:  # a model whose code fixes a size (a window count from the image): the batch only
                shapes = (tuple({0: "batch"} for _ in names),)
                torch.onnx.export(Hidden(model), args, path, dynamic_shapes=shapes, **kwargs)
        np.savez(path.with_suffix(".feeds.npz"), **inputs)
        return path
    except Exception as error:  # an architecture torch cannot export is a row with its reason
        path.unlink(missing_ok=True)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"


def _model(model_type: str, sizes: dict):
    """The model at tiny sizes, with SDPA attention where it has it (eager otherwise)."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(model_type, **sizes)
    # Experts as batched MatMuls: transformers' default (grouped_mm) has no ONNX function, its eager loop over the
    # experts a token chose does not trace. Models without experts ignore it.
    experts = {"experts_implementation": "batched_mm"} if model_type in MOE_AND_HYBRID else {}
    try:
        return AutoModel.from_config(config, attn_implementation="sdpa", **experts).eval()
    except ValueError:  # "does not support an attention implementation through scaled_dot_product_attention"
        return AutoModel.from_config(config, attn_implementation="eager", **experts).eval()


def _inputs(family: str, sizes: dict) -> tuple[dict[str, np.ndarray], dict[str, dict[int, str]]]:
    """The feeds a family's model takes, and their symbolic dims."""
    rng = np.random.default_rng(0)
    if family == "vision":
        size = sizes.get("image_size", 32)
        size = size[0] if isinstance(size, list) else size
        pixels = rng.standard_normal((2, sizes.get("num_channels", 3), size, size)).astype(np.float32)
        return {"pixel_values": pixels}, {"pixel_values": {0: "batch"}}
    if family == "speech":
        wave = rng.standard_normal((2, 1600)).astype(np.float32)
        return {"input_values": wave}, {"input_values": {0: "batch", 1: "samples"}}
    ids = rng.integers(3, sizes["vocab_size"], (2, 6)).astype(np.int64)
    mask = np.ones((2, 6), np.int64)
    if family == "decoder":
        mask[0, :2] = 0  # left padding, as generation pads
    else:
        mask[0, 4:] = 0  # right padding, as an encoder's batch pads
    text = {0: "batch", 1: "sequence"}
    inputs, dims = {"input_ids": ids, "attention_mask": mask}, {"input_ids": text, "attention_mask": text}
    if family == "seq2seq":
        inputs["decoder_input_ids"] = rng.integers(3, sizes["vocab_size"], (2, 5)).astype(np.int64)
        dims["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
    return inputs, dims


def fuse_all(path: Path) -> dict:
    import onnx

    import egfuse

    feeds = dict(np.load(path.with_suffix(".feeds.npz")))
    softmaxes = sum(n.op_type == "Softmax" for n in onnx.load(path, load_external_data=False).graph.node)
    row: dict = {"softmaxes": softmaxes}
    for target in TARGETS:
        try:
            report = egfuse.fuse(path, target=target, feeds=feeds).report
        except Exception as error:
            row[target] = {"error": f"{type(error).__name__}: {error}"[:200]}
            continue
        kept = {f"{r.status}: {r.reason}"[:140] for r in [*report.regions, *report.layer_ops, *report.rotary]
                if r.status != "fused" and not (target == "npu" and "keeps RoPE" in r.reason)}  # fmt: skip
        row[target] = {
            "attention": [report.fused, len(report.regions)],
            "layer_ops": [sum(r.status == "fused" for r in report.layer_ops), len(report.layer_ops)],
            "rotary": [sum(r.status == "fused" for r in report.rotary), len(report.rotary)],
            "validated": report.validated,
            "kept": sorted(kept)[:3],
        }
    return row


def markdown(rows: dict, failed: dict, seconds: float, dtype: str = "float32") -> str:
    def cell(entry: dict) -> str:
        if "error" in entry:
            return "error"
        a, la, r = entry["attention"], entry["layer_ops"], entry["rotary"]
        text = f"{a[0]}/{a[1]} · {la[0]}/{la[1]} · {r[0]}/{r[1]}"
        if entry["validated"]:
            return text
        unchanged = (
            entry["validated"] is None
            and not (a[0] or la[0] or r[0])
            and not any("not validated" in reason or "rolled back" in reason for reason in entry.get("kept", []))
        )  # nothing fused by choice (kept as cheaper): nothing to validate
        return text + (" (unchanged)" if unchanged else " (not validated)")

    lines = [
        "# Architectures egfuse was never developed on" + ("" if dtype == "float32" else f", in {dtype}"),
        "",
        f"Written by `experiments/unseen_architectures.py --dtype {dtype}` ({seconds:.0f} s): {len(rows)} "
        "transformers model types outside every corpus, tiny random configs, torch's dynamo exporter, fused and "
        "validated on each target. "
        "Each cell: attention blocks fused / regions found · norms and activations · rotations (npu keeps rotations "
        "by design).",
        "",
        "| model type | family | softmaxes | egfuse:ort | egfuse:onnx | egfuse:npu |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        family = OTHERS.get(name, (_LABELS.get(name, "decoder"),))[0]
        cells = " | ".join(cell(row[t]) for t in TARGETS)
        lines.append(f"| {name} | {family} | {row['softmaxes']} | {cells} |")
    if any(row[t].get("kept") for row in rows.values() for t in TARGETS):
        lines += ["", "Kept as written (first reasons):", ""]
        for name, row in rows.items():
            for target in TARGETS:
                for reason in row[target].get("kept", []):
                    lines.append(f"- {name} ({target}): {reason}")
    if failed:
        lines += ["", "Not exported by torch (not counted):", ""]
        lines += [f"- {name}: {why}" for name, why in failed.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="*", help="model types (default: all)")
    parser.add_argument("--out", type=Path, default=HERE / "corpus" / "unseen")
    parser.add_argument("--dtype", choices=sorted(SUFFIX), default="float32")
    args = parser.parse_args(argv)
    args.types = args.types or list(TYPES)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows, failed = {}, {}
    for model_type in args.types:
        made = export(model_type, args.out, args.dtype)
        if isinstance(made, str):
            failed[model_type] = made
            print(f"{model_type:<18} not exported: {made}", flush=True)
            continue
        rows[model_type] = fuse_all(made)
        print(f"{model_type:<18} " + "  ".join(f"{t}: {rows[model_type][t]}" for t in TARGETS)[:300], flush=True)
    seconds = time.perf_counter() - start
    RESULTS.mkdir(exist_ok=True)
    name = f"unseen_architectures{SUFFIX[args.dtype]}"
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "not_exported": failed}, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown(rows, failed, seconds, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
