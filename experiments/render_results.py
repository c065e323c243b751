"""Regenerate the results tables of :data:`DOCUMENTS` from experiments/results/.

    python experiments/render_results.py

The text between each pair of markers (``<!-- results:start -->``/``<!-- results:end -->``: coverage, speed
and latency; ``counts``: rules and patterns; ``drift``: coverage across exporter releases; ``variants``: the
spelling space; ``producers``: coverage on Keras, timm, open_clip, diffusers and torch's own modules' exports;
``reproduce``: how long reproduce.sh took) is replaced; nothing else is touched. The plots the
paper shows are copied into paper/figures/. tests/interface/test_paper.py fails when the committed text differs
from what this would write.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"
DOCUMENTS = ("README.md", "paper/egfuse.md", "experiments/README.md")
"""The files whose marked blocks this writes (and tests/interface/test_paper.py checks)."""
LAYER_FAMILIES = ("norms", "gelu", "tanh_gelu", "rotary")
"""Rule families for norms, activations and rotary embeddings: counted, but not attention's."""


def table() -> str:
    summary = json.loads((RESULTS / "summary.json").read_text())
    lines = []
    cov = summary.get("coverage")
    if cov:
        lines += [
            f"Coverage on the corpus ({summary.get('coverage_models')} exports, "
            f"{summary.get('coverage_blocks_expected')} attention blocks; fused **and** correct on onnxruntime, "
            "see `experiments/results/coverage.md`):",
            "",
            "| onnxruntime optimizer | onnxscript optimize_for_ort | egfuse --target ort | egfuse --target onnx |",
            "|---|---|---|---|",
            f"| {cov.get('ort', 0):.0%} | {cov.get('onnxscript', 0):.0%} | {cov.get('egfuse:ort', 0):.0%} "
            f"| {cov.get('egfuse:onnx', 0):.0%} |",
            "",
        ]
    speed = RESULTS / "optimize_speed.json"
    if speed.exists():
        data = json.loads(speed.read_text())
        deepest = max(data["layers"])
        t = data["families"]["bert"]["table"] if "families" in data else data["table"]

        def cell(tool: str) -> str:
            s = t.get(tool, {}).get(str(deepest)) or t.get(tool, {}).get(deepest)
            return f"{s['median_seconds']:.2f} s" if s and s.get("median_seconds") else "-"

        lines += [
            f"Optimizer time on a {deepest}-layer tiny BERT (median of {data['reps']} interleaved runs; Llama in "
            "`experiments/results/speed.md`):",
            "",
            "| egfuse (ort) | egfuse (ort, with validation) | onnxscript | onnxruntime optimizer |",
            "|---|---|---|---|",
            f"| {cell('egfuse:ort:novalidate')} | {cell('egfuse:ort')} | {cell('onnxscript')} | {cell('ort')} |",
            "",
        ]
    latency = RESULTS / "latency.json"
    if latency.exists():
        data = json.loads(latency.read_text())
        lines += ["Fused-model latency on onnxruntime CPU, relative to the unfused export (lower is faster; "
                  "`experiments/results/latency.md`):", "", data["markdown_table"], ""]  # fmt: skip
    gpu = RESULTS / "latency_gpu.json"
    if gpu.exists():
        data = json.loads(gpu.read_text())
        lines += [f"Fused-model latency on onnxruntime's CUDA provider ({data['device']}, onnxruntime "
                  f"{data['onnxruntime']}), float16 (rows named _bf16: bfloat16), relative to the unfused export "
                  "(lower is faster; `experiments/results/latency_gpu.md`; `egfuse:ort:cuda` is "
                  "`--provider CUDAExecutionProvider`):",
                  "", data["markdown_table"].rstrip(), ""]  # fmt: skip
    half = RESULTS / "half_coverage.json"
    if half.exists():
        lines += [_half_coverage(json.loads(half.read_text())), ""]
    return "\n".join(lines).rstrip() + "\n"


def _half_coverage(data: dict) -> str:
    """Blocks fused and correct per dtype and tool on the half-precision corpus (``half_coverage.json``)."""
    tools = data["tools"]
    rows = ["| dtype | " + " | ".join(tools) + " |", "|---|" + "---|" * len(tools)]
    for dtype, per_tool in data["summary"].items():
        cells = []
        for tool in tools:
            cell = per_tool[tool]
            wrong = f", {len(cell['fused_but_wrong'])} wrong" if cell["fused_but_wrong"] else ""
            cells.append(f"{cell['covered'] / max(cell['blocks'], 1):.0%} ({cell['covered']}/{cell['blocks']}{wrong})")
        rows.append(f"| {dtype} | " + " | ".join(cells) + " |")
    return (
        f"Half-precision coverage: the corpus's architectures exported again in float16 and bfloat16 (dynamo, "
        f"{data['models']} exports), attention blocks fused **and** correct — finite in half precision, the "
        "masks' meaning on float32 copies (bfloat16: the copies alone, the CPU runs none of it); "
        "`experiments/results/half_coverage.md`:\n\n" + "\n".join(rows)
    )


def counts() -> str:
    """The rule and pattern counts the paper quotes, from ``rules_vs_patterns.json`` (one paragraph)."""
    path = RESULTS / "rules_vs_patterns.json"
    if not path.exists():
        return "(run `python experiments/rules_vs_patterns.py` for the rule and pattern counts)\n"
    data = json.loads(path.read_text())
    ours, script, ort = data["egfuse_rules"], data["onnxscript_patterns"], data["ort_paths"]
    attention, sdpa = script["totals"]["attention"], script["sdpa"]
    paths = ort["totals"]["attention"]
    ablation = data["ablation"]
    families = len([name for name in ours["families"] if name != "facts"])
    layer = {name: f["rules"] for name, f in ours["families"].items() if name in LAYER_FAMILIES}
    layer_text = ", ".join(f"`{name}` {count}" for name, count in layer.items())
    return (
        f"egfuse carries {ours['total']} rules in {families} families besides its facts: {ours['rewrite_rules']} "
        f"rewrites and {ours['fact_rules']} fact rules that derive the conditions rewrites read (`scalar_of`, "
        f"`rank_of`, `finite`); of the rules, {sum(layer.values())} are for the rest of the layer, not attention "
        f"({layer_text}, RoPE's including its table facts), and some of `ort`'s are too. "
        f"onnxscript {script['onnxscript_version']}'s attention rules, as `optimize_for_ort` "
        f"applies them, are {attention['rules_as_used']} rules matching {attention['spellings']} concrete "
        f"spellings (SDPA alone: {sdpa['spellings']}, from its `OrValue` alternatives); with `commute()` applied "
        f"they would be {attention['commute_rules']} rules and {attention['commute_spellings']} spellings. "
        f"onnxruntime {ort['onnxruntime_version']}'s optimizer tries {paths['paths']} parent paths for attention "
        f"({paths['distinct']} distinct) in {paths['modules']} modules. With all its rules egfuse fuses "
        f"{ablation['all_rules']['covered']} of {ablation['variants']} spellings drawn uniformly from the generator "
        f"(`experiments/results/rules_vs_patterns.md`, which also removes one family at a time).\n"
    )


def _share(cell: dict) -> str:
    return "—" if cell["share"] is None else f"{100 * cell['share']:.0f}%"


def drift() -> str:
    """Coverage per tool across exporter releases, from ``exporter_drift.json`` (a table and the figure)."""
    path = RESULTS / "exporter_drift.json"
    if not path.exists():
        return "(run `python experiments/exporter_drift.py` for coverage across exporter releases)\n"
    data = json.loads(path.read_text())
    tools = data["tools"]
    totals = data["all_releases"]
    rows = ["| release | transformers | torch | " + " | ".join(tools) + " |", "|---|---|---|" + "---|" * len(tools)]
    for stack, versions in data["releases"].items():
        cells = " | ".join(_share(data["coverage"][tool][stack]["both"]) for tool in tools)
        rows.append(f"| {stack} | {versions['transformers']} | {versions['torch']} | {cells} |")
    rows.append("| **all** | | | " + " | ".join(f"{_share(totals[t])} ({totals[t]['expected']})" for t in tools) + " |")
    moves = data["movement"]
    others = [t for t in tools if not t.startswith("egfuse")]
    swings = ", ".join(
        f"{tool} {100 * moves[tool]['lowest']:.0f}–{100 * moves[tool]['highest']:.0f}%" for tool in others
    )
    return (
        f"Coverage across {len(data['releases'])} releases of the exporter stack, both exporters (TorchScript and "
        f"dynamo) together, {totals[tools[0]]['expected']} attention blocks in all (`experiments/results/"
        f"exporter_drift.md`, which splits the exporters; figure `paper/figures/exporter_drift.png`):\n\n"
        + "\n".join(rows)
        + f"\n\nPer release the other tools range over {swings}; the largest change egfuse:ort shows between two "
        f"consecutive releases is {100 * moves[tools[0]]['largest_step']:.0f} points.\n"
    )


PRODUCERS_START, PRODUCERS_END = "<!-- producers:start -->", "<!-- producers:end -->"
PRODUCER_NAMES = {
    "keras_tf2onnx": "Keras 3 → tf2onnx", "keras_export": "Keras 3 → `model.export`", "timm": "timm",
    "open_clip": "open_clip", "diffusers": "diffusers", "torch": "torch's own modules",
    "optimum_merged": "optimum's merged decoders",
}  # fmt: skip


def producers() -> str:
    """Coverage per producer and exporter, every tool, from ``producers_coverage.json`` (drift_coverage's format)."""
    path = RESULTS / "producers_coverage.json"
    if not path.exists():
        return "(run `python experiments/drift_coverage.py --corpus tests/data/producers --name producers_coverage`)\n"
    data = json.loads(path.read_text())
    tools, rows = data["tools"], data["rows"]

    def cell(chosen: list[dict]) -> str:
        expected = sum(r["expected"] for r in chosen)
        good = sum(r["correct_blocks"] for r in chosen)
        return f"{100 * good / expected:.0f}% ({good}/{expected})" if expected else "—"

    groups = sorted({(r["stack"], r["exporter"]) for r in rows}, key=lambda g: (list(PRODUCER_NAMES).index(g[0]), g[1]))
    lines = ["| producer | exporter | " + " | ".join(tools) + " |", "|---|---|" + "---|" * len(tools)]
    for stack, exporter in groups:
        cells = [
            cell([r for r in rows if (r["stack"], r["exporter"], r["tool"]) == (stack, exporter, t)]) for t in tools
        ]
        lines.append(f"| {PRODUCER_NAMES.get(stack, stack)} | {exporter} | " + " | ".join(cells) + " |")
    lines.append("| **all** | | " + " | ".join(cell([r for r in rows if r["tool"] == t]) for t in tools) + " |")
    failed = len(data["failed_exports"])
    return (
        f"Blocks fused **and** correct on {len({r['file'] for r in rows})} exports from producers other than "
        f"transformers + torch.onnx ({failed} exports the producers themselves could not make are not counted; "
        "`experiments/results/producers_coverage.md` lists them and every reason):\n\n" + "\n".join(lines) + "\n"
    )


def variant_space() -> str:
    """The size of the spelling space and each tool's coverage of a uniform sample, from ``variant_space.json``."""
    path = RESULTS / "variant_space.json"
    if not path.exists():
        return "(run `python experiments/variant_space.py` for the variant space and its coverage)\n"
    data = json.loads(path.read_text())
    space, tools = data["space"], data["tools"]
    rows = ["| tool | covered (fused and correct) | fused but wrong |", "|---|---|---|"]
    for tool in tools:
        cell = data["coverage"][tool]
        rows.append(
            f"| {tool} | {100 * cell['share']:.1f}% ({cell['covered']}/{data['samples']}) | {cell['fused_wrong']} |"
        )
    egraph = data.get("egraph", {}).get("egfuse:ort")
    cost = ""
    if egraph:
        cost = (
            f" On `ort` the e-graph of one block ends at a median of {egraph['enodes_after']['median']:.0f} e-nodes "
            f"(at most {egraph['enodes_after']['max']:.0f}), {egraph['growth']['median']:.2f}× what lowering wrote, "
            "after "
            f"a median of {egraph['iterations']['median']:.0f} iterations; saturation stopped on a budget in "
            f"{egraph['budget_hit']} of {egraph['runs']} runs."
        )
    return (
        f"The generator's {len(space['axes'])} axes span {space['product_of_axes']:,} choices; "
        f"**{space['space_size']:,}** of them are distinct spellings of attention (counted exactly: "
        "`experiments/variant_space.py`). "
        f"On {data['samples']:,} spellings drawn uniformly from that space (seed {data['seed']}), each tool's output "
        "judged by one standard (egfuse's validation criteria on fresh feeds and their mask sets):\n\n"
        + "\n".join(rows)
        + f"\n\nPer-axis coverage is in `experiments/results/variant_space.md`.{cost}\n"
    )


REPRODUCE = ROOT / "experiments" / "reproduce.sh"


def _minutes(seconds: int) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min"


def reproduce_times() -> str:
    """How long one run of ``reproduce.sh`` took, step by step, from the ``reproduce_times.tsv`` it writes.

    The steps expected are read from the script itself, so a run that stopped part way is rendered as partial
    rather than as a short total. The render step is timed after this text is written: it is left out."""
    path = RESULTS / "reproduce_times.tsv"
    if not path.exists():
        return "(run `bash experiments/reproduce.sh` to time every step)\n"
    lines = path.read_text().splitlines()
    run = dict(field.split("=", 1) for field in lines[0].lstrip("# ").split())
    measured = dict(line.split("\t") for line in lines[1:] if line.strip())
    expected = [
        line.split()[1]
        for line in REPRODUCE.read_text().splitlines()
        if line.startswith("step ") and "render_results" not in line
    ]
    rows = ["| step | time |", "|---|---|"]
    rows += [f"| `{step}` | {_minutes(int(measured[step]))} |" for step in expected if step in measured]
    total = sum(int(measured[step]) for step in expected if step in measured)
    missing = [step for step in expected if step not in measured]
    start = (
        "from a fresh clone's state: no corpus built, no variant-space cache"
        if run["corpus"] == run["cache"] == "absent"
        else f"corpora {run['corpus']}, variant-space cache {run['cache']}"
    )
    head = f"One run of `bash experiments/reproduce.sh` at {run['commit']} ({run['day']}, {run['cores']} cores, "
    head += f"{start})"
    if missing:
        not_run = ", ".join(f"`{step}`" for step in missing)
        head += f" stopped part way; the steps it finished took {_minutes(total)} ({not_run} not run):"
    else:
        head += f" took **{_minutes(total)}**:"
    rows.append(f"| **all** | **{_minutes(total)}** |")
    return head + "\n\n" + "\n".join(rows) + "\n"


def render(path: Path, body: str, start: str = START, end: str = END) -> bool:
    text = path.read_text()
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{body}{end}{tail}")
    return True


COUNTS_START, COUNTS_END = "<!-- counts:start -->", "<!-- counts:end -->"


def latency_into_speed_md() -> None:
    """speed.md carries the fused-model latency table too (one page for every speed figure)."""
    latency, speed = RESULTS / "latency.json", RESULTS / "speed.md"
    if not (latency.exists() and speed.exists()):
        return
    text = speed.read_text().split("\n## Fused-model latency")[0].rstrip()
    table = json.loads(latency.read_text())["markdown_table"]
    speed.write_text(
        f"{text}\n\n## Fused-model latency on onnxruntime CPU\n\nBatch 1, median of interleaved runs; "
        f"ratio to the unfused export in parentheses (`latency.json`).\n\n{table}\n"
    )


DRIFT_START, DRIFT_END = "<!-- drift:start -->", "<!-- drift:end -->"
VARIANTS_START, VARIANTS_END = "<!-- variants:start -->", "<!-- variants:end -->"
REPRODUCE_START, REPRODUCE_END = "<!-- reproduce:start -->", "<!-- reproduce:end -->"
FIGURES = ("exporter_drift.png", "variant_space.png", "rules_vs_patterns.png", "cost_model.png", "optimize_seconds.png")
"""Plots the paper shows, copied from experiments/results/ into paper/figures/."""


def sections() -> list[tuple[str, str, str]]:
    """Each generated block of text: (start marker, end marker, body)."""
    return [
        (START, END, table()),
        (COUNTS_START, COUNTS_END, counts()),
        (DRIFT_START, DRIFT_END, drift()),
        (VARIANTS_START, VARIANTS_END, variant_space()),
        (PRODUCERS_START, PRODUCERS_END, producers()),
        (REPRODUCE_START, REPRODUCE_END, reproduce_times()),
    ]


def main() -> int:
    latency_into_speed_md()
    for path in (ROOT / document for document in DOCUMENTS):
        for start, end, body in sections():
            if path.exists() and render(path, body, start, end):
                print(f"updated {start.split()[1].split(':')[0]} in {path.relative_to(ROOT)}")
    figures = ROOT / "paper" / "figures"
    figures.mkdir(exist_ok=True)
    for name in FIGURES:
        if (RESULTS / name).exists():
            shutil.copyfile(RESULTS / name, figures / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
