"""The merged-decoder corpus: decoders as optimum ships them — one ``If`` on a ``use_cache_branch`` input choosing
between the decoder without a KV cache and the decoder with one (``decoder_model_merged.onnx``: the format of
optimum's ONNX exports and of the transformers.js models on the Hugging Face Hub).

Each model is a tiny random transformers decoder (2 layers, width 32: Llama with grouped K/V heads and RoPE,
GPT-2 with its fused QKV projection; SDPA and eager attention), exported twice with torch's TorchScript exporter
at opset 14 as optimum exports decoders — without a cache (``present.*`` out) and with one (``past_key_values.*``
in) — and merged by optimum-onnx's own ``merge_decoders``. Every attention block sits inside a branch: ``blocks``
counts both branches' (layers × 2). The merged model is checked on onnxruntime against torch on both sides of the
condition; the stored feeds take the cache branch (a decode step: one new token over 4 cached, the second row
left-padded).

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
from importlib import metadata
from pathlib import Path

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
    return transformers.GPT2Config(vocab_size=99, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                                   attn_implementation=impl)  # fmt: skip


def _steps(family: str, impl: str):
    """The decoder without a cache and with one, sharing one set of weights; each returns the hidden states and
    the present keys and values."""
    import torch
    import transformers
    from transformers import DynamicCache

    cfg = _config(family, impl)
    net = (transformers.LlamaModel if family == "llama" else transformers.GPT2Model)(cfg).eval()

    def outputs(out):
        return (out.last_hidden_state, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

    class NoCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask):
            cache = DynamicCache(config=cfg)
            return outputs(self.net(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                    use_cache=True))  # fmt: skip

    class WithCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache(config=cfg)
            for i in range(LAYERS):
                cache.update(past[2 * i], past[2 * i + 1], i)
            return outputs(self.net(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                    use_cache=True))  # fmt: skip

    kv_heads = cfg.num_key_value_heads if family == "llama" else HEADS
    # eval() on the wrappers: the exporter puts back the mode it found, and a wrapper in training mode would
    # turn GPT-2's dropout back on for every later call
    return NoCache().eval(), WithCache().eval(), kv_heads


def build(family: str, impl: str, out_dir: Path) -> dict:
    import onnxruntime as ort
    import torch
    from optimum.onnx.graph_transformations import merge_decoders

    name = f"{family}_{impl}"
    entry = {"name": name, "exporter": "torchscript", "file": None, "blocks": 2 * LAYERS, "error": None,
             "flavour": ["merged decoder", "kv cache", *(["gqa", "rope"] if family == "llama" else ["mha"])],
             "heads": HEADS, "head_dim": WIDTH // HEADS}  # fmt: skip
    start = time.perf_counter()
    torch.manual_seed(0)
    no_cache, with_cache, kv_heads = _steps(family, impl)
    present = [f"present.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    past_names = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 99, (2, PAST + 1)).astype(np.int64)
    mask = np.ones((2, PAST + 1), np.int64)
    mask[1, 0] = 0  # the second row left-padded
    past = [rng.standard_normal((2, kv_heads, PAST, WIDTH // HEADS)).astype(np.float32) for _ in past_names]
    total = "past_sequence_length + sequence_length"
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "attention_mask": {0: "batch_size", 1: total},
            **{p: {0: "batch_size", 2: total} for p in present}}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):  # fmt: skip
        warnings.simplefilter("ignore")
        first, second = Path(scratch) / "decoder.onnx", Path(scratch) / "decoder_with_past.onnx"
        torch.onnx.export(no_cache, (torch.from_numpy(prompt), torch.from_numpy(mask)), str(first),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", *present],
                          dynamic_axes=axes, opset_version=14, dynamo=False)  # fmt: skip
        cached = {**axes, **{p: {0: "batch_size", 2: "past_sequence_length"} for p in past_names}}
        step = (torch.from_numpy(prompt[:, :1]), torch.from_numpy(mask), *(torch.from_numpy(p) for p in past))
        torch.onnx.export(with_cache, step, str(second), input_names=["input_ids", "attention_mask", *past_names],
                          output_names=["last_hidden_state", *present], dynamic_axes=cached, opset_version=14,
                          dynamo=False)  # fmt: skip
        path = out_dir / f"{name}.torchscript.onnx"
        merge_decoders(str(first), str(second), strict=False, save_path=str(path))
    feeds = {"input_ids": prompt[:, :1], "attention_mask": mask, **dict(zip(past_names, past, strict=True)),
             "use_cache_branch": np.array([True])}  # fmt: skip
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    diff = 0.0
    for use_cache, args, inputs in ((True, step, feeds), (False, (torch.from_numpy(prompt), torch.from_numpy(mask)),
                                    {"input_ids": prompt, "attention_mask": mask})):  # fmt: skip
        with torch.no_grad():
            expected = (with_cache if use_cache else no_cache)(*args)
        run = {**feeds, **inputs, "use_cache_branch": np.array([use_cache])}
        got = session.run(None, run)
        diff = max(diff, *(float(np.max(np.abs(g - e.numpy()))) for g, e in zip(got, expected, strict=True)))
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
    for family in ("llama", "gpt2"):
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
