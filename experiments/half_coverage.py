"""Half-precision coverage, side by side: every architecture of the coverage corpus exported again in float16
and in bfloat16 (torch's dynamo exporter, opset 18: ``corpus.py --set half_all``), each tool's output judged
as the variant space judges it (:func:`egfuse.testing.disagreements`: the export's feeds and every
mask-exercising set; in half precision finite values where the original's rows are, the masks' meaning on
float32 copies of both models — the only judge a bfloat16 model gets on a CPU, which runs none of it). A
model's blocks count when its fused attention ops number the blocks and nothing disagrees.

    python experiments/corpus.py --out experiments/corpus/half --set half_all   # once, ~3 min
    python experiments/half_coverage.py                                          # ~10 min on 2 cores
    python experiments/half_coverage.py --tools egfuse:ort egfuse:onnx --only gpt2_eager_fp16

Every (model, tool) optimizes in its own process (``optimize_worker.py``, with a timeout: a crash is a row).
Writes results/half_coverage.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from compare import ORT_MODEL_TYPE, family  # noqa: E402
from fingerprint import source_fingerprint  # noqa: E402

from egfuse.commands.fanout import fan_out  # noqa: E402

TOOLS = ("egfuse:ort", "egfuse:onnx", "egfuse:npu", "onnxscript", "ort")
DTYPES = {"_fp16": "float16", "_bf16": "bfloat16"}


def _feeds(model_path: Path) -> dict[str, np.ndarray]:
    """The export's feeds in the model's own input types (npz holds no bfloat16: such feeds are stored as
    float32)."""
    import onnx

    feeds = dict(np.load(str(model_path).replace(".onnx", ".feeds.npz")))
    model = onnx.load(model_path, load_external_data=False)
    types = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
    return {name: value.astype(types[name]) if name in types else value for name, value in feeds.items()}


def judge_one(entry: dict, tool: str, corpus: Path, hidden: int, timeout: float) -> dict:
    """One tool on one export: blocks fused (attention ops written; regions for the npu target) and what
    :func:`egfuse.testing.disagreements` finds."""
    import onnx

    from egfuse.testing import disagreements

    path = corpus / entry["file"]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "optimized.onnx"
        cmd = [sys.executable, str(HERE / "optimize_worker.py"), tool, str(path), "--out", str(out),
               "--heads", str(entry["heads"]), "--hidden", str(hidden),
               "--model-type", ORT_MODEL_TYPE[family(entry["name"])]]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"fused": 0, "correct": False, "reason": f"timeout after {timeout:.0f}s"}
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr.strip()[-200:]}
        if not record.get("ok"):
            return {"fused": 0, "correct": False, "reason": str(record.get("error", "failed"))[:200]}
        fused = sum((record.get("fused") or {}).values())
        if fused == 0:
            return {"fused": 0, "correct": False, "reason": "nothing fused", "seconds": record.get("seconds")}
        try:
            problems = disagreements(onnx.load(path), onnx.load(out), _feeds(path))
        except Exception as error:  # a model the judge cannot run is not correct
            problems = [f"{type(error).__name__}: {str(error)[:160]}"]
    return {"fused": fused, "correct": not problems, "reason": problems[0][:200] if problems else "",
            "seconds": record.get("seconds")}  # fmt: skip


def repo_relative(reason: str) -> str:
    """``reason`` with this checkout's path cut (onnxruntime's errors name the model's file): results hold
    repo-relative paths."""
    return reason.replace(f"{HERE.parent}/", "")


def summarise(rows: list[dict], tools: tuple[str, ...]) -> dict:
    """Per dtype and tool: blocks fused and correct of all blocks, models fused but wrong."""
    summary: dict = defaultdict(dict)
    for dtype in DTYPES.values():
        mine = [r for r in rows if r["dtype"] == dtype]
        total = sum(r["blocks"] for r in mine if r["tool"] == tools[0])
        for tool in tools:
            theirs = [r for r in mine if r["tool"] == tool]
            good = sum(min(r["fused"], r["blocks"]) for r in theirs if r["correct"])
            wrong = [r["model"] for r in theirs if r["fused"] and not r["correct"]]
            summary[dtype][tool] = {"blocks": total, "covered": good, "fused_but_wrong": wrong}
    return dict(summary)


def markdown(result: dict) -> str:
    tools = result["tools"]
    lines = [
        "# Half-precision coverage (half_coverage)",
        "",
        f"{result['models']} exports of the coverage corpus's architectures in float16 and bfloat16 (dynamo, "
        f"opset 18); egfuse as of {result['egfuse']}. A block counts when it is fused and the model agrees with "
        "the original (`egfuse.testing.disagreements`: finite values in half precision, the masks' meaning on "
        "float32 copies; bfloat16 is judged on the copies alone, the CPU runs none of it).",
        "",
        "| dtype | " + " | ".join(tools) + " |",
        "|---|" + "---|" * len(tools),
    ]
    for dtype, per_tool in result["summary"].items():
        cells = []
        for tool in tools:
            s = per_tool[tool]
            share = s["covered"] / s["blocks"] if s["blocks"] else 0.0
            wrong = f", {len(s['fused_but_wrong'])} wrong" if s["fused_but_wrong"] else ""
            cells.append(f"{share:.0%} ({s['covered']}/{s['blocks']}{wrong})")
        lines.append(f"| {dtype} | " + " | ".join(cells) + " |")
    if result["export_failures"]:
        lines += ["", "Not exported (torch.export fails on them, so no tool sees them): "
                  + ", ".join(result["export_failures"]) + "."]  # fmt: skip
    lines += ["", "Not covered (model: reason):", ""]
    for row in result["rows"]:
        if not (row["correct"] and row["fused"] >= row["blocks"]):
            why = row["reason"] or f"{row['fused']}/{row['blocks']} blocks fused"
            lines.append(f"- {row['tool']} · {row['model']}: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=HERE / "corpus" / "half")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS))
    parser.add_argument("--only", nargs="*", help="model names")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--merge", action="store_true", help="keep the earlier results' other rows")
    args = parser.parse_args(argv)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    entries = [e for e in manifest["models"] if e["file"] and (not args.only or e["name"] in args.only)]
    tools = tuple(args.tools)
    jobs = [(e, t, args.corpus, manifest["hidden"], args.timeout) for e in entries for t in tools]
    rows = []
    for i, outcome in fan_out(judge_one, jobs, workers=args.workers):
        entry, tool = jobs[i][0], jobs[i][1]
        if isinstance(outcome, Exception):
            outcome = {"fused": 0, "correct": False, "reason": repr(outcome)[:200]}
        dtype = next(d for s, d in DTYPES.items() if entry["name"].endswith(s))
        outcome["reason"] = repo_relative(outcome.get("reason", ""))
        row = {"model": entry["name"], "dtype": dtype, "tool": tool, "blocks": entry["blocks"], **outcome}
        rows.append(row)
        verdict = "ok" if row["correct"] else row["reason"][:80]
        print(f"{entry['name']:<30} {tool:<12} {row['fused']}/{row['blocks']} {verdict}", flush=True)
    path = RESULTS / "half_coverage.json"
    if args.merge and path.exists():  # a partial re-run replaces its (model, tool) rows and keeps the others
        earlier = json.loads(path.read_text())
        fresh = {(r["model"], r["tool"]) for r in rows}
        tools = tuple(dict.fromkeys([*earlier["tools"], *tools]))
        rows += [r for r in earlier["rows"] if (r["model"], r["tool"]) not in fresh]
    rows.sort(key=lambda r: (r["dtype"], r["model"], tools.index(r["tool"])))
    models = len({r["model"] for r in rows})
    failed = [e["name"] for e in manifest["models"] if not e["file"]]
    result = {"egfuse": source_fingerprint(), "models": models, "tools": list(tools),
              "export_failures": failed, "summary": summarise(rows, tools), "rows": rows}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "half_coverage.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
