"""Coverage, side by side: onnxruntime's optimizer, onnxscript's optimize_for_ort and egfuse (both targets) on
the same exported models. A block counts only if it is fused *and* the model still loads and gives the
original's outputs (max abs diff ≤ 1e-4) on onnxruntime.

    python experiments/corpus.py --out experiments/corpus/hf        # once: export the corpus
    python experiments/compare.py                                    # ~10 min on 2 cores
    python experiments/compare.py --smoke                            # 3 models, 1 tool each (CI)

Every (model, tool) runs in its own process (``optimize_worker.py``) with a timeout: a crash is a row.
Writes results/coverage.md and the ``coverage`` entries of results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
TOOLS = ["ort", "onnxscript", "egfuse:ort", "egfuse:onnx"]
ALL_TOOLS = [*TOOLS, "egfuse:npu"]
"""Every tool a row may name (``--tools`` picks; the default leaves out the npu target, measured on request)."""
TOLERANCE = 1e-4
SMOKE = [("bert_sdpa", "dynamo", "egfuse:ort"), ("llama_eager", "torchscript", "egfuse:onnx"),
         ("gpt2_sdpa", "dynamo", "onnxscript")]  # fmt: skip

# onnxruntime.transformers.optimizer needs a model_type; the closest one it has for each family.
ORT_MODEL_TYPE = {"bert": "bert", "bart": "bart", "vit": "vit", "whisper": "bart", "gpt2": "gpt2", "llama": "gpt2",
                  "t5": "t5", "deberta": "bert"}  # fmt: skip


def family(name: str) -> str:
    return next((f for f in ORT_MODEL_TYPE if name.startswith(f)), "bert")


def run(entry: dict, tool: str, corpus: Path, hidden: int, timeout: float) -> dict:
    model = corpus / entry["file"]
    feeds = corpus / entry["file"].replace(".onnx", ".feeds.npz")
    cmd = [sys.executable, str(HERE / "optimize_worker.py"), tool, str(model), "--check", str(feeds),
           "--heads", str(entry["heads"]), "--hidden", str(hidden), "--model-type",
           ORT_MODEL_TYPE[family(entry["name"])]]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"crashed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


def score(entry: dict, record: dict) -> tuple[int, str]:
    """(blocks fused and correct, reason when fewer than expected; onnxruntime's errors name the model's file,
    so the repo's own path is cut from them: results hold repo-relative paths)."""
    good, reason = _score(entry, record)
    return good, reason.replace(f"{HERE.resolve().parent}/", "")


def _score(entry: dict, record: dict) -> tuple[int, str]:
    expected = entry["blocks"]
    fused = sum((record.get("fused") or {}).values())
    if not record.get("ok"):
        return 0, record.get("error", "failed")
    if not record.get("loads"):
        return 0, f"fused model does not load: {record.get('load_error', '')[:120]}"
    if not record.get("runs"):
        return 0, f"fused model fails to run: {record.get('run_error', '')[:120]}"
    diff = record.get("max_abs_diff", float("inf"))
    if diff > TOLERANCE:
        return 0, f"outputs differ by {diff:.3g}"
    if fused < expected:
        return fused, f"{fused}/{expected} blocks fused"
    return expected, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=HERE / "corpus" / "hf")
    parser.add_argument("--tools", nargs="+", default=TOOLS)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--smoke", action="store_true", help="a few models, one tool each (for CI)")
    parser.add_argument(
        "--update", action="store_true", help="re-measure only --tools; keep the other tools' rows from coverage.json"
    )
    args = parser.parse_args(argv)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    entries = manifest["models"]
    jobs = [(e, t) for e in entries if e["file"] for t in args.tools]
    if args.smoke:
        wanted = {(m, x): t for m, x, t in SMOKE}
        jobs = [(e, wanted[(e["name"], e["exporter"])]) for e in entries
                if e["file"] and (e["name"], e["exporter"]) in wanted]  # fmt: skip
    rows = []
    for i, (entry, tool) in enumerate(jobs, 1):
        record = run(entry, tool, args.corpus, manifest["hidden"], args.timeout)
        good, reason = score(entry, record)
        rows.append({"model": entry["name"], "exporter": entry["exporter"], "tool": tool, "flavour": entry["flavour"],
                     "expected": entry["blocks"], "fused_ops": record.get("fused") or {}, "correct_blocks": good,
                     "loads": record.get("loads"), "max_abs_diff": record.get("max_abs_diff"),
                     "seconds": record.get("seconds"), "reason": reason})  # fmt: skip
        print(f"[{i:>3}/{len(jobs)}] {entry['file']:<38} {tool:<12} {good}/{entry['blocks']} {reason[:70]}", flush=True)
    failed_exports = [e for e in entries if not e["file"]]
    if args.smoke:
        bad = [r for r in rows if r["correct_blocks"] < r["expected"] and r["tool"].startswith("egfuse")]
        print("smoke:", "ok" if not bad else f"{len(bad)} egfuse rows below expectation")
        return 1 if bad else 0
    tools = args.tools
    if args.update:  # the same corpus, other tools as last measured
        kept = [r for r in json.loads((RESULTS / "coverage.json").read_text())["rows"] if r["tool"] not in tools]
        tools = [t for t in ALL_TOOLS if t in tools or any(r["tool"] == t for r in kept)]
        rows = sorted(kept + rows, key=lambda r: tools.index(r["tool"]))
    write(rows, failed_exports, tools)
    return 0


def coverage(rows: list[dict]) -> float:
    expected = sum(r["expected"] for r in rows)
    return round(sum(r["correct_blocks"] for r in rows) / expected, 4) if expected else 0.0


def write(rows: list[dict], failed_exports: list[dict], tools: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    by_tool = {t: [r for r in rows if r["tool"] == t] for t in tools}
    summary_path = RESULTS / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["coverage"] = {t: coverage(rs) for t, rs in by_tool.items()}
    summary["coverage_blocks_expected"] = sum(r["expected"] for r in by_tool[tools[0]])
    summary["coverage_models"] = len(by_tool[tools[0]])
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (RESULTS / "coverage.json").write_text(json.dumps({"rows": rows, "failed_exports": failed_exports}, indent=1))

    lines = ["# Attention coverage", "",
             "A block counts when it is fused **and** the optimized model loads on onnxruntime CPU and matches the "
             f"original within {TOLERANCE:g} (max abs diff) on the corpus feeds (padding in the attention mask).", "",
             "| tool | coverage |", "|---|---|"]  # fmt: skip
    lines += [f"| {t} | {summary['coverage'][t]:.1%} |" for t in tools]
    for title, key in (("By flavour", "flavour"), ("By exporter", "exporter")):
        groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            keys = r[key] if isinstance(r[key], list) else [r[key]]
            for k in keys:
                groups[k][r["tool"]].append(r)
        lines += ["", f"## {title}", "", "| " + key + " | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
        for k in sorted(groups):
            lines.append(f"| {k} | " + " | ".join(f"{coverage(groups[k][t]):.0%}" for t in tools) + " |")
    lines += ["", "## Per model", "", "| model | exporter | blocks | " + " | ".join(tools) + " |",
              "|---|---|---|" + "---|" * len(tools)]  # fmt: skip
    models = sorted({(r["model"], r["exporter"], r["expected"]) for r in rows})
    for name, exporter, expected in models:
        cells = []
        for t in tools:
            r = next(x for x in rows if x["model"] == name and x["exporter"] == exporter and x["tool"] == t)
            cells.append(f"{r['correct_blocks']}/{expected}" + (f" ({r['reason']})" if r["reason"] else ""))
        lines.append(f"| {name} | {exporter} | {expected} | " + " | ".join(cells) + " |")
    if failed_exports:
        lines += ["", "## Exports that failed (not counted)", ""]
        lines += [f"- {e['name']} ({e['exporter']}): {e['error']}" for e in failed_exports]
    lines += ["", "Versions: see summary.json.", ""]
    (RESULTS / "coverage.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
