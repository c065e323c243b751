"""Optimizer speed and memory, side by side in one run: egfuse vs onnxscript vs onnxruntime's optimizer.

Tiny random BERTs (hidden 64, 4 heads, SDPA attention, dynamo export) at several depths; every
(model, tool) runs in its own process (``optimize_worker.py``), repetitions are interleaved (tool A, tool B,
… then again) and medians are reported with ratios, since absolute seconds on a shared machine are noise.
The time is the optimizer's own, from the model file to the optimized model in memory (imports excluded:
they are the same constant for every run of a tool); peak RSS is the worker's.

    python experiments/bench_speed.py                 # BERT and Llama at 2/12/24/48 layers, 3 repetitions
    python experiments/bench_speed.py --layers 2 12 --reps 1     # quick look
    python experiments/bench_speed.py --layers 48 --reps 5 --tools egfuse:ort egfuse:ort:serial --name ahead

Writes experiments/results/optimize_speed.json, speed.md, optimize_seconds.png (with matplotlib) and the
``optimize_seconds_ratio_vs_onnxscript`` entry of summary.json. Needs the ``corpus`` extra.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
MODELS = HERE / "corpus" / "bench"
TOOLS = ["egfuse:ort:novalidate", "egfuse:ort", "egfuse:ort:serial", "egfuse:onnx:novalidate", "onnxscript", "ort"]
"""``egfuse:ort:serial``: validated, with the original's runs in this process after the search rather than run
ahead beside it (:mod:`egfuse.validation.ahead`) — what the run-ahead saves, measured side by side."""
HIDDEN, HEADS = 64, 4


FAMILIES = {  # model family → (transformers config, model, sizes at a given depth, ORT model_type)
    "bert": ("BertConfig", "BertModel", lambda n: {"vocab_size": 99, "hidden_size": HIDDEN, "num_hidden_layers": n,
             "num_attention_heads": HEADS, "intermediate_size": 4 * HIDDEN, "max_position_embeddings": 64}, "bert"),
    "llama": ("LlamaConfig", "LlamaModel", lambda n: {"vocab_size": 99, "hidden_size": HIDDEN, "num_hidden_layers": n,
              "num_attention_heads": HEADS, "num_key_value_heads": HEADS // 2, "intermediate_size": 4 * HIDDEN,
              "max_position_embeddings": 64, "use_cache": False}, "gpt2"),
}  # fmt: skip


def export(family: str, layers: int) -> Path:
    """A tiny random model of the family at the given depth (SDPA attention, dynamo export), cached."""
    path = MODELS / f"{family}_{layers}l.dynamo.onnx"
    if path.exists():
        return path
    sys.path.insert(0, str(HERE))
    import corpus

    config, model, sizes, _ = FAMILIES[family]
    build = corpus._hf(config, model, corpus._ids, sizes(layers))("sdpa")
    MODELS.mkdir(parents=True, exist_ok=True)
    entry = corpus.export(corpus.Spec(f"{family}_{layers}l", build, layers, []), "dynamo", MODELS)
    if entry.error:
        raise SystemExit(f"export of the {layers}-layer {family} failed: {entry.error}")
    return path


def run_tool(tool: str, model: Path, model_type: str, timeout: float) -> dict:
    cmd = [sys.executable, str(HERE / "optimize_worker.py"), tool, str(model), "--heads", str(HEADS),
           "--hidden", str(HIDDEN), "--model-type", model_type]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "ok": False, "error": f"timeout after {timeout:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"tool": tool, "ok": False, "error": f"crashed (exit {proc.returncode}): {proc.stderr[-300:]}"}
    return json.loads(lines[-1])


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "machine": platform.machine()}
    for pkg in ("egfuse", "egglog", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def update_summary(key: str, value) -> None:
    path = RESULTS / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary[key] = value
    summary.setdefault("versions", versions())
    path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 12, 24, 48])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tools", nargs="+", default=TOOLS)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--name", help="write optimize_speed_NAME.json and speed_NAME.md (a side measurement: the "
                        "main results, summary.json and the plot are left as they are)")  # fmt: skip
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    models = {(f, n): export(f, n) for f in args.families for n in args.layers}
    runs = {f: {t: {n: [] for n in args.layers} for t in args.tools} for f in args.families}
    total = args.reps * len(models) * len(args.tools)
    done = 0
    for rep in range(args.reps):
        for (family, layers), path in models.items():
            for tool in args.tools:  # interleaved: each tool sees the same machine state on average
                record = run_tool(tool, path, FAMILIES[family][3], args.timeout)
                runs[family][tool][layers].append(record)
                done += 1
                status = f"{record['seconds']:.2f}s" if record.get("ok") else record.get("error", "?")[:60]
                print(f"[{done:>3}/{total}] rep {rep + 1} {family} {layers:>3} layers {tool:<24} {status}", flush=True)

    deepest = max(args.layers)
    result = {"layers": args.layers, "reps": args.reps, "families": {}, "versions": versions(),
              "model": f"tiny random models, hidden {HIDDEN}, {HEADS} heads (Llama: {HEADS // 2} KV heads), SDPA "
                       "attention, dynamo export"}  # fmt: skip
    ratios_vs_onnxscript = {}
    for family, by_tool in runs.items():
        table = {
            tool: {n: _summarize(records) for n, records in by_layers.items()} for tool, by_layers in by_tool.items()
        }
        base = table.get("egfuse:ort:novalidate", table.get(args.tools[0], {})).get(deepest, {}).get("median_seconds")
        ratios = {t: table[t][deepest]["median_seconds"] / base for t in args.tools
                  if base and table[t][deepest]["median_seconds"]}  # fmt: skip
        result["families"][family] = {"table": table, "seconds_ratio_vs_egfuse_at_deepest": ratios}
        if "onnxscript" in ratios:
            ratios_vs_onnxscript[family] = round(1 / ratios["onnxscript"], 4)
    if args.name:
        (RESULTS / f"optimize_speed_{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        write_markdown(result, RESULTS / f"speed_{args.name}.md")
        return 0
    (RESULTS / "optimize_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    if "bert" in ratios_vs_onnxscript:
        update_summary("optimize_seconds_ratio_vs_onnxscript", ratios_vs_onnxscript["bert"])
    update_summary("optimize_seconds_ratio_vs_onnxscript_by_family", ratios_vs_onnxscript)
    write_markdown(result)
    plot(result)
    return 0


def _summarize(records: list[dict]) -> dict:
    ok = [r for r in records if r.get("ok")]
    return {
        "median_seconds": statistics.median(r["seconds"] for r in ok) if ok else None,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ok) if ok else None,
        "fused": ok[0]["fused"] if ok else None,
        "errors": [r["error"] for r in records if not r.get("ok")],
    }


def write_markdown(result: dict, path: Path = RESULTS / "speed.md") -> None:
    layers = result["layers"]
    lines = [
        "# Optimizer speed",
        "",
        f"Models: {result['model']}. Median of {result['reps']} interleaved runs, each in its own process; "
        "seconds are the optimizer's own (model file → optimized model in memory), peak RSS is the process's.",
    ]
    for family, data in result["families"].items():
        header = " | ".join(f"{n} layers" for n in layers)
        lines += ["", f"## {family}", "", f"| tool | {header} | fused at deepest | peak RSS at deepest |",
                  "|---|" + "---|" * (len(layers) + 2)]  # fmt: skip
        for tool, by_layers in data["table"].items():
            cells = [f"{by_layers[n]['median_seconds']:.2f} s" if by_layers[n]["median_seconds"] else "failed"
                     for n in layers]  # fmt: skip
            deepest = by_layers[max(layers)]
            fused = ", ".join(f"{k} {v}" for k, v in (deepest["fused"] or {}).items()) or "none"
            rss = f"{deepest['peak_rss_mb']:.0f} MB" if deepest["peak_rss_mb"] else "-"
            lines.append(f"| {tool} | " + " | ".join(cells) + f" | {fused} | {rss} |")
        first = next(iter(data["table"]))
        base = "egfuse (ort target, no validation)" if "egfuse:ort:novalidate" in data["table"] else first
        lines += ["", f"Seconds relative to {base} at {max(layers)} layers:", ""]
        lines += [f"- {tool}: {r:.2f}×" for tool, r in data["seconds_ratio_vs_egfuse_at_deepest"].items()]
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), ""]
    path.write_text("\n".join(lines))


def plot(result: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    families = result["families"]
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    for ax, (family, data) in zip(axes[0], families.items(), strict=True):
        for tool, by_layers in data["table"].items():
            xs = [n for n in result["layers"] if by_layers[n]["median_seconds"]]
            ax.plot(xs, [by_layers[n]["median_seconds"] for n in xs], marker="o", label=tool)
        ax.set_xlabel("layers")
        ax.set_ylabel("optimize seconds (median)")
        ax.set_title(f"Attention fusion time vs depth (tiny {family})")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "optimize_seconds.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
