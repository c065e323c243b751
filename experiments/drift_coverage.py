"""Coverage on the exporter-drift corpus: per stack × exporter × tool, the attention blocks fused *and* correct.

Each (model, tool) runs through compare.py's machinery (``optimize_worker.py`` in its own process with a
timeout, then onnxruntime checks the result against the original on the stored feeds); a block counts only if
the fused model loads and matches within compare.TOLERANCE. Exports that failed are listed, not counted.

    python experiments/drift_coverage.py                                  # every complete stack, every tool
    python experiments/drift_coverage.py --tools egfuse:ort egfuse:onnx --stacks 2023-12 2024-06
    python experiments/drift_coverage.py --name drift_coverage_before      # results under another name
    python experiments/drift_coverage.py --stacks 2025-11 --only t5_eager --merge   # re-measure some exports

Writes results/<name>.json (rows with per-model reasons) and results/<name>.md (the table).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402 - experiments/ is not a package

CORPUS = ROOT / "tests" / "data" / "drift"
TOOLS = ["egfuse:ort", "egfuse:onnx", "egfuse:npu", "onnxscript", "ort"]
FAMILY = {  # architecture → the compare.ORT_MODEL_TYPE family onnxruntime's optimizer is told (its closest type)
    **dict.fromkeys(["gpt_neo", "gptj", "opt", "codegen", "mistral", "qwen2", "phi", "bloom", "falcon"], "gpt2"),
    **dict.fromkeys(["roberta", "distilbert", "squeezebert", "funnel", "wav2vec2"], "bert"),
}


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _stacks(corpus: Path, wanted: list[str] | None) -> list[Path]:
    """Stack directories whose manifest exists (a stack without one is still being exported)."""
    dirs = sorted(d for d in corpus.iterdir() if (d / "manifest.json").exists())
    return [d for d in dirs if not wanted or d.name in wanted]


def measure(entry: dict, tool: str, stack_dir: Path, hidden: int, timeout: float) -> dict:
    arch = entry["name"].rsplit("_", 1)[0].removesuffix("_past")
    told = {**entry, "name": FAMILY.get(arch, arch)}  # only compare.family reads the name
    record = compare.run(told, tool, stack_dir, hidden, timeout)
    # optimize_worker keeps its output beside the model when the check fails: not corpus data
    (stack_dir / f"{entry['file']}.{tool.replace(':', '_')}.tmp.onnx").unlink(missing_ok=True)
    good, reason = compare.score(entry, record)
    details = _egfuse_reasons(stack_dir / entry["file"], tool, timeout) if tool.startswith("egfuse") and reason else []
    return {
        "stack": stack_dir.name, "model": entry["name"], "exporter": entry["exporter"], "tool": tool,
        "file": _relative(stack_dir / entry["file"]), "flavour": entry["flavour"], "expected": entry["blocks"],
        "fused_ops": record.get("fused") or {}, "correct_blocks": good, "max_abs_diff": record.get("max_abs_diff"),
        "seconds": record.get("seconds"), "reason": reason, "egfuse_reasons": details,
    }  # fmt: skip


def _egfuse_reasons(model: Path, tool: str, timeout: float) -> list[str]:
    """Why egfuse left blocks unfused: its own report (``egfuse optimize --report``) per region not fused, its
    validation note, and — when it found no region at all — where the model's Softmax nodes are."""
    import subprocess
    import tempfile

    import onnx

    feeds = model.with_name(model.name.replace(".onnx", ".feeds.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "egfuse", "optimize", str(model), "-o", str(Path(tmp) / "out.onnx"), "-q",
               "--target", tool.split(":")[1], "--feeds", str(feeds), "--report", str(report_path)]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [f"timeout after {timeout:.0f}s"]
        if not report_path.exists():
            return [f"egfuse optimize failed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"]
        report = json.loads(report_path.read_text())
    reasons = [f"{r.get('status')}: {r.get('reason')}" for r in report.get("regions", []) if r.get("status") != "fused"]
    if report.get("validation_note"):
        reasons.append(f"validation: {report['validation_note']}")
    if not report.get("regions"):
        proto = onnx.load(str(model), load_external_data=False)
        main = sum(n.op_type == "Softmax" for n in proto.graph.node)
        local = sum(n.op_type == "Softmax" for f in proto.functions for n in f.node)
        reasons.append(f"no attention region: {main} Softmax in the main graph, {local} in {len(proto.functions)} "
                       "model-local functions")  # fmt: skip
    return reasons


@functools.cache
def _original_fails(model: Path) -> str | None:
    """Why the exported model itself does not load or run on onnxruntime with its feeds (None when it does)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        session.run(None, dict(np.load(model.with_name(model.name.replace(".onnx", ".feeds.npz")))))
    except Exception as err:
        return str(err).strip().splitlines()[0].replace(f"{ROOT}/", "")[:200]  # results hold repo paths
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--stacks", nargs="*", help="stack names (default: every complete stack)")
    parser.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--jobs", type=int, default=1, help="workers at once (each its own process)")
    parser.add_argument("--name", default="drift_coverage", help="results file name (without extension)")
    parser.add_argument("--merge", action="store_true", help="keep the other stacks' and tools' rows of <name>.json")
    parser.add_argument("--only", nargs="*", help="model names to measure (with --merge: only their rows are replaced)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    jobs, failed, versions = [], [], {}
    for stack_dir in _stacks(args.corpus, args.stacks):
        manifest = json.loads((stack_dir / "manifest.json").read_text())
        versions[stack_dir.name] = {k: manifest.get(k) for k in ("transformers", "torch", "onnxscript", "python")}
        for entry in manifest["models"]:
            broken = _original_fails(stack_dir / entry["file"]) if entry["file"] else None
            if broken:  # no tool can be asked to keep the meaning of a model onnxruntime cannot run
                entry = {**entry, "error": f"the export does not run on onnxruntime: {broken}"}
                failed.append({"stack": stack_dir.name, **{k: entry[k] for k in ("name", "exporter", "error")}})
            elif entry["file"] and (not args.only or entry["name"] in args.only):
                jobs += [(entry, tool, stack_dir, manifest["hidden"]) for tool in args.tools]
            else:
                failed.append({"stack": stack_dir.name, **{k: entry[k] for k in ("name", "exporter", "error")}})

    def one(job: tuple) -> dict:
        entry, tool, stack_dir, hidden = job
        row = measure(entry, tool, stack_dir, hidden, args.timeout)
        print(f"{row['stack']} {row['file'].rsplit('/', 1)[-1]:<40} {tool:<12} {row['correct_blocks']}/"
              f"{row['expected']} {row['reason'][:80]}", flush=True)  # fmt: skip
        return row

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    seconds, tools = round(time.perf_counter() - start, 1), args.tools
    old_path = compare.RESULTS / f"{args.name}.json"
    if args.merge and old_path.exists():  # a stack or tool measured now replaces its old rows, others are kept
        old = json.loads(old_path.read_text())
        if args.only:  # only the measured exports' rows are replaced; the stacks' failed exports stay as they were
            fresh = {(r["stack"], r["file"], r["tool"]) for r in rows}
            kept = [r for r in old["rows"] if (r["stack"], r["file"], r["tool"]) not in fresh]
            failed = old["failed_exports"]
        else:
            fresh = {(r["stack"], r["tool"]) for r in rows}
            kept = [r for r in old["rows"] if (r["stack"], r["tool"]) not in fresh]
            failed = [f for f in old["failed_exports"] if f["stack"] not in versions] + failed
        for r in kept:  # rows measured before the originals were checked
            broken = _original_fails(ROOT / r["file"])
            if broken and not any((f["stack"], f["name"], f["exporter"]) == (r["stack"], r["model"], r["exporter"])
                                  for f in failed):  # fmt: skip
                error = f"the export does not run on onnxruntime: {broken}"
                failed.append({"stack": r["stack"], "name": r["model"], "exporter": r["exporter"], "error": error})
        rows = [r for r in kept if not _original_fails(ROOT / r["file"])] + rows
        versions = {**old["stacks"], **versions}
        tools = [t for t in TOOLS if t in tools or t in old["tools"]]
        seconds += old["seconds"]
    rows.sort(key=lambda r: (r["stack"], r["exporter"], r["model"], TOOLS.index(r["tool"])))
    write(rows, failed, versions, tools, args.name, seconds)
    return 0


def _cell(rows: list[dict]) -> str:
    expected = sum(r["expected"] for r in rows)
    good = sum(r["correct_blocks"] for r in rows)
    if not expected:
        return "–"
    share = f"{good / expected:.0%}" if good in (0, expected) or good / expected < 0.99 else f"{good / expected:.1%}"
    if share == "100%" and good < expected:  # never round a miss up to a full score
        share = f"{good / expected:.1%}"
    return f"{share} ({good}/{expected})"


def write(rows: list[dict], failed: list[dict], versions: dict, tools: list[str], name: str, seconds: float) -> None:
    import onnxruntime

    egfuse_version = __import__("importlib.metadata").metadata.version("egfuse")
    groups = sorted({(r["stack"], r["exporter"]) for r in rows}, key=lambda g: (g[0], g[1] != "torchscript"))
    table = {f"{s}/{e}/{t}": {"expected": sum(r["expected"] for r in rows if (r["stack"], r["exporter"], r["tool"])
                                             == (s, e, t)),
                              "correct": sum(r["correct_blocks"] for r in rows if (r["stack"], r["exporter"],
                                                                                   r["tool"]) == (s, e, t))}
             for s, e in groups for t in tools}  # fmt: skip
    result = {"tools": tools, "tolerance": compare.TOLERANCE, "egfuse": egfuse_version,
              "onnxruntime": onnxruntime.__version__, "stacks": versions, "seconds": seconds, "table": table,
              "rows": rows, "failed_exports": failed}  # fmt: skip
    compare.RESULTS.mkdir(parents=True, exist_ok=True)
    (compare.RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")

    lines = [f"# Drift coverage ({name})", "",
             "Attention blocks fused **and** correct (the optimized model loads on onnxruntime CPU and matches the "
             f"original within {compare.TOLERANCE:g} on the stored feeds), per stack (release month of the "
             "transformers + torch pair) and exporter. Exports that failed are not counted (listed below).", "",
             f"egfuse {egfuse_version}, onnxruntime {onnxruntime.__version__}; {len(rows)} runs in {seconds:.0f} s.",
             "", "| stack | transformers | torch | exporter | " + " | ".join(tools) + " |",
             "|---|---|---|---|" + "---|" * len(tools)]  # fmt: skip
    for stack, exporter in groups:
        v = versions[stack]
        cells = [_cell([r for r in rows if (r["stack"], r["exporter"], r["tool"]) == (stack, exporter, t)])
                 for t in tools]  # fmt: skip
        lines.append(f"| {stack} | {v['transformers']} | {v['torch']} | {exporter} | " + " | ".join(cells) + " |")
    cells = [_cell([r for r in rows if r["tool"] == t]) for t in tools]
    lines.append("| **all** | | | | " + " | ".join(cells) + " |")
    for tool in tools:
        reasons = Counter(_kind(r["reason"]) for r in rows if r["tool"] == tool and r["reason"])
        details = Counter(_kind(d) for r in rows if r["tool"] == tool for d in set(r.get("egfuse_reasons") or []))
        if details:
            title = f"## Most common egfuse reasons: {tool} (rows that name it)"
            lines += ["", title, "", "| rows | reason | example |", "|---|---|---|"]
            for reason, count in details.most_common(10):
                example = next(r["file"] for r in rows if r["tool"] == tool and
                               reason in {_kind(d) for d in r.get("egfuse_reasons") or []})  # fmt: skip
                lines.append(f"| {count} | {reason} | `{example}` |")
        if reasons:
            lines += ["", f"## Most common reasons: {tool}", "", "| rows | reason | example |", "|---|---|---|"]
            for reason, count in reasons.most_common(10):
                example = next(r["file"] for r in rows if r["tool"] == tool and _kind(r["reason"]) == reason)
                lines.append(f"| {count} | {reason} | `{example}` |")
    if failed:
        lines += ["", "## Exports that failed (not counted)", ""]
        lines += [f"- {f['stack']} {f['name']} ({f['exporter']}): {(f['error'] or '')[:160]}" for f in failed]
    (compare.RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def _kind(reason: str) -> str:
    """A reason without its counts and numbers, so that rows group by what went wrong."""
    import re

    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", reason)[:140]


if __name__ == "__main__":
    sys.exit(main())
