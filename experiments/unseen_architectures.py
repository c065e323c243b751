"""Architectures egfuse was never developed on: transformers model types outside every corpus, exported fresh and fused.

Each model type is built from its config at tiny sizes (random weights, nothing downloaded: hidden 32, 4 query
heads, 2 K/V heads, head size 8, 2 layers), exported by torch's dynamo exporter (opset 18) with a padded mask, and
fused for every egfuse target with validation on the export's own feeds. What is counted per target: attention
blocks fused (of the regions found), norms and activations, rotations, and whether validation passed. Softmaxes
that are not attention (a router's) are regions egfuse reports and keeps; the table says how many a model has.

    python experiments/unseen_architectures.py                 # export (cached under --out) and fuse
    python experiments/unseen_architectures.py --types glm qwen3

Writes experiments/results/unseen_architectures.{json,md}. Needs the ``corpus`` extra (torch, transformers).
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

TYPES = [
    "apertus", "arcee", "bitnet", "cohere", "doge", "ernie4_5", "exaone4", "falcon_h1", "gemma3_text", "glm", "glm4",
    "gpt_neox", "granite", "helium", "hunyuan_v1_dense", "jetmoe", "lfm2", "modernbert", "nemotron", "olmo", "olmo2",
    "olmo3", "phi3", "qwen3", "seed_oss", "smollm3", "stablelm", "starcoder2",
]  # fmt: skip
"""Model types in none of egfuse's corpora (tests/data, the drift corpus, held-out, producers) when this was run."""
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=64, head_dim=8, pad_token_id=None, bos_token_id=None,
             eos_token_id=None)  # fmt: skip
TARGETS = ("ort", "onnx", "npu")


def export(model_type: str, out: Path) -> Path | str:
    """The export's path, or why it could not be made."""
    path = out / f"{model_type}.dynamo.onnx"
    if path.exists():
        return path
    import torch
    from transformers import AutoConfig, AutoModel

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    try:
        config = AutoConfig.for_model(model_type, **SIZES)
        model = AutoModel.from_config(config, attn_implementation="sdpa").eval()
        torch.manual_seed(0)
        ids = torch.randint(0, SIZES["vocab_size"], (2, 6))
        mask = torch.ones(2, 6, dtype=torch.int64)
        mask[0, :2] = 0  # left padding
        dims = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            names = {"input_names": ["input_ids", "attention_mask"], "output_names": ["last_hidden_state"]}
            torch.onnx.export(
                Hidden(model), (ids, mask), path, dynamo=True, dynamic_shapes=dims, optimize=False, **names
            )
        np.savez(path.with_suffix(".feeds.npz"), input_ids=ids.numpy(), attention_mask=mask.numpy())
        return path
    except Exception as error:  # an architecture torch cannot export is a row with its reason
        path.unlink(missing_ok=True)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


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


def markdown(rows: dict, failed: dict, seconds: float) -> str:
    def cell(entry: dict) -> str:
        if "error" in entry:
            return "error"
        a, la, r = entry["attention"], entry["layer_ops"], entry["rotary"]
        return f"{a[0]}/{a[1]} · {la[0]}/{la[1]} · {r[0]}/{r[1]}" + ("" if entry["validated"] else " (not validated)")

    lines = [
        "# Architectures egfuse was never developed on",
        "",
        f"Written by `experiments/unseen_architectures.py` ({seconds:.0f} s): {len(rows)} transformers model types "
        "outside every corpus, tiny random configs, torch's dynamo exporter, fused and validated on each target. "
        "Each cell: attention blocks fused / regions found · norms and activations · rotations (npu keeps rotations "
        "by design).",
        "",
        "| model type | softmaxes | egfuse:ort | egfuse:onnx | egfuse:npu |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['softmaxes']} | " + " | ".join(cell(row[t]) for t in TARGETS) + " |")
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
    parser.add_argument("--types", nargs="*", default=list(TYPES))
    parser.add_argument("--out", type=Path, default=HERE / "corpus" / "unseen")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows, failed = {}, {}
    for model_type in args.types:
        made = export(model_type, args.out)
        if isinstance(made, str):
            failed[model_type] = made
            print(f"{model_type:<18} not exported: {made}", flush=True)
            continue
        rows[model_type] = fuse_all(made)
        print(f"{model_type:<18} " + "  ".join(f"{t}: {rows[model_type][t]}" for t in TARGETS)[:300], flush=True)
    seconds = time.perf_counter() - start
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "unseen_architectures.json").write_text(json.dumps({"rows": rows, "not_exported": failed}, indent=1))
    (RESULTS / "unseen_architectures.md").write_text(markdown(rows, failed, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
