"""The merged-decoder corpus: decoders as optimum ships them — one ``If`` on a ``use_cache_branch`` input choosing
between the decoder without a KV cache and the decoder with one (``decoder_model_merged.onnx``: the format of
optimum's ONNX exports and of the transformers.js models on the Hugging Face Hub).

Each model is a tiny random transformers decoder (2 layers, width 32: Llama with grouped K/V heads and RoPE,
GPT-2 with its fused QKV projection, the decoders of BART, Whisper and T5 with cross-attention to an encoder
output (BART's and T5's padded; Whisper's decoder takes no mask at all, as optimum exports it; T5's scores
unscaled, with its relative position bias), whose keys and values the cached step reads from the cache; SDPA and
eager attention), exported twice with torch's TorchScript exporter at opset 14 as optimum exports decoders —
without a cache (``present.*`` out) and with one (``past_key_values.*`` in; a seq2seq decoder's cached step
returns only its own keys and values, as optimum's does) — and merged by optimum-onnx's own ``merge_decoders``.
Every attention block sits inside a branch: ``blocks`` counts both branches' (layers × 2, and × 2 again for the
seq2seq decoders' cross-attention). The merged model is checked on onnxruntime against torch on both sides of
the condition; the stored feeds take the cache branch (a decode step: one new token over 4 cached, the second row
left-padded). Re-exporting gives the same graphs, though not always the same bytes (optimum's merge orders shared
initializers by Python's string hashes).

Environment: egfuse's venv with the ``corpus`` extra, plus optimum-onnx without its dependencies (it pins
transformers < 4.58, which its merge does not use)::

    pip install --no-deps optimum==2.1.0 optimum-onnx==0.1.0
    python experiments/merged_decoders.py          # → tests/data/producers/optimum_merged/
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "producers" / "optimum_merged"
LAYERS, WIDTH, HEADS, PAST, TOLERANCE = 2, 32, 4, 4, 1e-4
PACKAGES = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "onnxscript", "numpy")


def _config(family: str, impl: str):
    import transformers

    if family == "llama":
        return transformers.LlamaConfig(vocab_size=99, hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                        num_key_value_heads=HEADS // 2, max_position_embeddings=64,
                                        attn_implementation=impl)  # fmt: skip
    if family == "whisper":
        return transformers.WhisperConfig(vocab_size=99, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                          encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                          encoder_ffn_dim=2 * WIDTH, decoder_ffn_dim=2 * WIDTH, num_mel_bins=8,
                                          max_source_positions=16, max_target_positions=16, pad_token_id=0,
                                          attn_implementation=impl)  # fmt: skip
    if family == "t5":
        return transformers.T5Config(vocab_size=99, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=2 * WIDTH,
                                     num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS,
                                     relative_attention_num_buckets=8, decoder_start_token_id=0, dropout_rate=0.0,
                                     attn_implementation=impl)  # fmt: skip
    if family == "bart":
        return transformers.BartConfig(vocab_size=99, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                       encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                       encoder_ffn_dim=2 * WIDTH, decoder_ffn_dim=2 * WIDTH,
                                       max_position_embeddings=64, attn_implementation=impl)  # fmt: skip
    return transformers.GPT2Config(vocab_size=99, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                                   attn_implementation=impl)  # fmt: skip


@dataclass
class Steps:
    """A decoder's two steps as optimum exports them, sharing one set of weights, and their inputs."""

    no_cache: Any
    with_cache: Any
    prompt: dict[str, np.ndarray]  # what the step without a cache reads
    step: dict[str, np.ndarray]  # what the step with one reads: one new token, the cache
    present: list[str]  # the outputs beside last_hidden_state, the step without a cache's (the other's a prefix)
    past: list[str]
    axes: dict[str, dict[int, str]]


def _steps(family: str, impl: str) -> Steps:
    """The decoder without a cache and with one; each returns the hidden states and the present keys and values
    (a seq2seq decoder's step with a cache returns only its own: the encoder's are the cache's, as in optimum)."""
    import torch
    import transformers
    from transformers import DynamicCache, EncoderDecoderCache

    cfg = _config(family, impl)
    rng = np.random.default_rng(0)
    mask = np.ones((2, PAST + 1), np.int64)
    mask[1, 0] = 0  # the second row left-padded
    prompt = {"input_ids": rng.integers(0, 99, (2, PAST + 1)).astype(np.int64), "attention_mask": mask}
    total = "past_sequence_length + sequence_length"
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "attention_mask": {0: "batch_size", 1: total}}
    seq2seq = family in ("bart", "whisper", "t5")
    kinds = ("decoder", "encoder") if seq2seq else ("",)
    present = [f"present.{i}.{k}{'.' if k else ''}{t}" for i in range(LAYERS) for k in kinds for t in ("key", "value")]
    past = [p.replace("present", "past_key_values") for p in present]
    if seq2seq:
        model = {"bart": transformers.BartModel, "whisper": transformers.WhisperModel, "t5": transformers.T5Model}[
            family
        ]
        net = model(cfg).get_decoder().eval()
        encoded = 6
        prompt["encoder_hidden_states"] = rng.standard_normal((2, encoded, WIDTH)).astype(np.float32)
        axes["encoder_hidden_states"] = {0: "batch_size", 1: "encoder_sequence_length"}
        if family in ("bart", "t5"):
            encoder_mask = np.ones((2, encoded), np.int64)
            encoder_mask[1, -2:] = 0
            prompt["encoder_attention_mask"] = encoder_mask
            axes["encoder_attention_mask"] = {0: "batch_size", 1: "encoder_sequence_length"}
        else:  # optimum's Whisper decoder takes no mask: the causal one comes from the positions
            del prompt["attention_mask"], axes["attention_mask"]
    else:
        net = (transformers.LlamaModel if family == "llama" else transformers.GPT2Model)(cfg).eval()
    kv_heads = cfg.num_key_value_heads if family == "llama" else HEADS
    step = {**prompt, "input_ids": prompt["input_ids"][:, :1]}
    for name in past:
        length = encoded if ".encoder." in name else PAST
        step[name] = rng.standard_normal((2, kv_heads, length, WIDTH // HEADS)).astype(np.float32)
    for name in present:
        axes[name] = {0: "batch_size", 2: "encoder_sequence_length" if ".encoder." in name else total}
    for name in past:
        axes[name] = {0: "batch_size", 2: "encoder_sequence_length" if ".encoder." in name else "past_sequence_length"}
    own = [n for n in present if ".encoder." not in n]

    def run(inputs, cache, *, everything: bool):
        out = net(**inputs, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        layers = cache.self_attention_cache.layers if seq2seq else cache.layers
        tensors = [[layer.keys, layer.values] for layer in layers]
        if seq2seq and everything:
            tensors = [[*mine, c.keys, c.values] for mine, c in zip(tensors, cache.cross_attention_cache.layers,
                                                                       strict=True)]  # fmt: skip
        return (out.last_hidden_state, *[t for pair in tensors for t in pair])

    names = list(prompt)

    class NoCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *args):
            cache = DynamicCache(config=cfg)
            cache = EncoderDecoderCache(cache, DynamicCache(config=cfg)) if seq2seq else cache
            return run(dict(zip(names, args, strict=True)), cache, everything=True)

    class WithCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *args):
            inputs, tensors = dict(zip(names, args[: len(names)], strict=True)), args[len(names) :]
            given = dict(zip(past, tensors, strict=True))
            mine, cross = DynamicCache(config=cfg), DynamicCache(config=cfg)
            for i in range(LAYERS):
                tag = f"{i}.decoder." if seq2seq else f"{i}."
                mine.update(given[f"past_key_values.{tag}key"], given[f"past_key_values.{tag}value"], i)
                if seq2seq:
                    cross.update(given[f"past_key_values.{i}.encoder.key"], given[f"past_key_values.{i}.encoder.value"],
                                 i)  # fmt: skip
            return run(inputs, EncoderDecoderCache(mine, cross) if seq2seq else mine, everything=False)

    # eval() on the wrappers: the exporter puts back the mode it found, and a wrapper in training mode would
    # turn GPT-2's dropout back on for every later call
    return Steps(NoCache().eval(), WithCache().eval(), prompt, step, present if seq2seq else own, past, axes)


def build(family: str, impl: str, out_dir: Path) -> dict:
    import onnxruntime as ort
    import torch
    from optimum.onnx.graph_transformations import merge_decoders

    name = f"{family}_{impl}"
    cross = ["mha", "cross attention", "encoder cache"]
    flavour = {"llama": ["gqa", "rope"], "gpt2": ["mha"], "bart": cross, "whisper": [*cross, "no mask"],
               "t5": [*cross, "relative position bias", "no scale"]}[family]  # fmt: skip
    blocks = 2 * LAYERS * (1 if family in ("llama", "gpt2") else 2)  # both branches; self- and cross-attention
    entry = {"name": name, "exporter": "torchscript", "file": None, "blocks": blocks, "error": None,
             "flavour": ["merged decoder", "kv cache", *flavour], "heads": HEADS,
             "head_dim": WIDTH // HEADS}  # fmt: skip
    start = time.perf_counter()
    torch.manual_seed(0)
    steps = _steps(family, impl)
    own = [p for p in steps.present if ".encoder." not in p]
    tensors = {name: torch.from_numpy(value) for name, value in {**steps.prompt, **steps.step}.items()}
    prompt_args = tuple(torch.from_numpy(v) for v in steps.prompt.values())
    step_args = tuple(tensors[n] for n in steps.step)
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):  # fmt: skip
        warnings.simplefilter("ignore")
        first, second = Path(scratch) / "decoder.onnx", Path(scratch) / "decoder_with_past.onnx"
        torch.onnx.export(steps.no_cache, prompt_args, str(first), input_names=list(steps.prompt),
                          output_names=["last_hidden_state", *steps.present], dynamic_axes=steps.axes,
                          opset_version=14, dynamo=False)  # fmt: skip
        torch.onnx.export(steps.with_cache, step_args, str(second), input_names=list(steps.step),
                          output_names=["last_hidden_state", *own], dynamic_axes=steps.axes, opset_version=14,
                          dynamo=False)  # fmt: skip
        path = out_dir / f"{name}.torchscript.onnx"
        merge_decoders(str(first), str(second), strict=False, save_path=str(path))
    feeds = {**steps.step, "use_cache_branch": np.array([True])}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diff = 0.0
    names = [o.name for o in session.get_outputs()]
    for use_cache, module, args, inputs, outputs in (
        (True, steps.with_cache, step_args, steps.step, ["last_hidden_state", *own]),
        (False, steps.no_cache, prompt_args, steps.prompt, ["last_hidden_state", *steps.present]),
    ):
        with torch.no_grad():
            expected = dict(zip(outputs, module(*args), strict=True))
        got = dict(zip(names, session.run(None, {**feeds, **inputs, "use_cache_branch": np.array([use_cache])}),
                       strict=True))  # fmt: skip
        diff = max(diff, *(float(np.max(np.abs(got[n] - e.numpy()))) for n, e in expected.items()))
    entry["framework_max_abs_diff"] = diff
    if not diff <= TOLERANCE:
        path.unlink()
        entry["error"] = f"onnxruntime disagrees with torch: max abs diff {diff:.3g}"
    else:
        entry["file"] = path.name
        entry["inputs"] = {n: {"shape": list(v.shape), "dtype": str(v.dtype)} for n, v in feeds.items()}
        np.savez(out_dir / f"{name}.torchscript.feeds.npz", **feeds)
    entry["export_seconds"] = round(time.perf_counter() - start, 2)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    entries = []
    for family in ("llama", "gpt2", "bart", "whisper", "t5"):
        for impl in ("sdpa", "eager"):
            entry = build(family, impl, args.out)
            print(f"{entry['name']:<12} {'ok' if entry['error'] is None else entry['error']}", flush=True)
            entries.append(entry)
    versions = {}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    manifest = {
        "stack": "optimum_merged", "producer": "optimum-onnx merge_decoders", "versions": versions,
        "torch": versions.get("torch"), "transformers": versions.get("transformers"),
        "onnxscript": versions.get("onnxscript"), "python": platform.python_version(),
        "hidden": WIDTH, "heads": HEADS, "layers": LAYERS, "models": entries,
    }  # fmt: skip
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
