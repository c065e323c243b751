"""The variant space of attention spellings: how big it is, and how much of it each tool covers.

The axes are the property-test generator's (``egfuse.testing.AXES``: scale placement and form, K layout, mask
kinds and fills, causal forms, NaN guard, commuted operands, projection bias, heads, GQA/MQA, symbolic or
static dims, cross-attention, half precision, KV cache and how it is read, RoPE forms and tables, position
bias, soft-capping, head layouts, BLOOM's baddbmm, Einsum, OPT's clamp, query-dependent biases, QDQ pairs,
batched MatMuls, dropout forms, text dims). A *spelling* is a canonical choice on every axis but the sizes
(``egfuse.testing.canonical``: what the repair of incompatible choices leaves unchanged, with choices the rest
makes meaningless at their defaults), so each spelling is counted once.

1. ``space_size`` — counted exactly. Enumerating the product outright is out of reach (about 10¹³ points), so
   values the repair and the constraints treat alike are counted as one class with a weight, and axes no
   constraint reads multiply the count; ``--verify`` checks both claims on random points against the
   generator's own code (a value swapped within its class, a free axis flipped: canonical or not, the same).
2. ``samples`` — spellings drawn uniformly from the space with a fixed seed (rejection sampling over the
   product: a draw counts only if canonical, so every spelling is equally likely).
3. ``coverage`` — per tool, the share of sampled spellings whose one attention block is fused *and* correct:
   the optimized model's outputs match the original's on the property tests' feeds and on each of their
   mask-exercising sets (heavy padding on both sides, random masks, a row masked entirely, a float mask
   written additively), judged as egfuse's validation judges (``egfuse.testing.disagreements``) — the same
   judge for every tool. Tools: egfuse on each target (with its own validation on), onnxscript's
   ``optimize_for_ort``, onnxruntime's ``transformers.optimizer`` (``model_type="bert"``, the generic one).
4. ``per_axis`` — coverage per tool for each value of each axis.

    python experiments/variant_space.py                   # count, draw 2,000, run every tool (~1 h on 2 cores)
    python experiments/variant_space.py --samples 200     # a smaller sample
    python experiments/variant_space.py --verify          # check the counting's classes and free axes

Outcomes are cached per (spelling, tool) in ``experiments/results/.variant_space_cache.jsonl`` keyed by a
fingerprint of egfuse's sources and the tools' versions, so an interrupted run resumes where it stopped.
Writes results/variant_space.{json,md} and results/variant_space.png (when matplotlib imports).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT))

from egfuse.testing import AXES, Variant, canonical  # noqa: E402

TOOLS = ("egfuse:ort", "egfuse:onnx", "egfuse:npu", "onnxscript", "ort")

CLASSES: dict[str, tuple[tuple[Any, ...], ...]] = {
    "scale": (("qk_mul",), ("k_div", "split_sqrt"), ("qk_div", "q_mul", "runtime", "custom", "none")),
    "mask": (
        ("additive_before_scale",),
        ("none", "additive", "additive_first", "where_neginf", "where_finfo", "where_reversed", "padding_int"),
    ),
    "causal": (("none",), ("trilu", "range_greater"), ("buffer_where", "buffer_local")),
    "softcap": (("none",), ("div", "reciprocal")),
    "query_bias": (("none",), ("rel_pos_uv",), ("relative", "gated")),
    "dropout": (("castlike",), ("none", "plain", "ratio", "training_false")),
}
"""Values the repair and the constraints treat alike: within a class, swapping one value for another never
changes whether a choice is canonical (checked by ``--verify``). Each class is enumerated once, by its first
value, and weighs as many spellings as it has values."""

FREE = ("commuted", "proj_bias", "clamp", "text_dims")
"""Axes no constraint reads: every value of each combines with everything."""

ROPE_FREE = ("rope_partial", "rope_interleaved", "concat")
"""Axes read only by RoPE (at their defaults without it) and by no constraint."""

PAIRED = ("dtype", "qdq")
"""Two axes constrained only by each other (QDQ pairs quantize float32 tensors)."""

SIZES = ("head_dim",)


def _space_axes() -> dict[str, tuple]:
    return {name: values for name, values in AXES.items() if name not in SIZES}


def _enumerated() -> list[str]:
    return [name for name in _space_axes() if name not in (*FREE, *ROPE_FREE, *PAIRED)]


def _values(name: str) -> list[tuple[Any, int]]:
    """(representative, weight) for an enumerated axis."""
    if name in CLASSES:
        return [(group[0], len(group)) for group in CLASSES[name]]
    return [(value, 1) for value in AXES[name]]


def _paired_count() -> int:
    return sum(
        canonical(dict(zip(PAIRED, combo, strict=True))) is not None
        for combo in itertools.product(*(AXES[n] for n in PAIRED))
    )


def _count_chunk(first: tuple[Any, int]) -> tuple[int, int]:
    """Spellings (weighted) and canonical class points with the first enumerated axis at one value."""
    names = _enumerated()
    free = math.prod(len(AXES[n]) for n in FREE) * _paired_count()
    rope_free = math.prod(len(AXES[n]) for n in ROPE_FREE)
    total = points = 0
    rest = [_values(n) for n in names[1:]]
    for combo in itertools.product(*rest):
        choices = {names[0]: first[0], **{n: v for n, (v, _) in zip(names[1:], combo, strict=True)}}
        if canonical(choices) is None:
            continue
        weight = first[1] * math.prod(w for _, w in combo)
        total += weight * free * (rope_free if choices["rope"] else 1)
        points += 1
    return total, points


def space_size(jobs: int) -> dict[str, Any]:
    """The exact count, one process per value of the first enumerated axis."""
    names = _enumerated()
    start = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        parts = list(pool.map(_count_chunk, _values(names[0])))
    product = math.prod(len(v) for v in _space_axes().values())
    size = sum(total for total, _ in parts)
    return {
        "space_size": size,
        "product_of_axes": product,
        "axes": {name: len(values) for name, values in _space_axes().items()},
        "enumerated_points": math.prod(len(_values(n)) for n in names),
        "canonical_points": sum(points for _, points in parts),
        "seconds": round(time.perf_counter() - start, 1),
    }


def verify(points: int, seed: int) -> dict[str, Any]:
    """The counting's two claims, on random points of the product: swapping a value within its class, or
    changing a free axis (a RoPE-only axis where RoPE is on; the paired axes within their valid pairs), never
    changes whether the point is canonical."""
    rng = random.Random(seed)
    axes = _space_axes()
    checked = failures = 0
    examples: list[str] = []
    canonical_seen = 0
    while canonical_seen < points:
        choices = {name: rng.choice(values) for name, values in axes.items()}
        if canonical(choices) is None:
            # bias towards canonical points: most raw draws are not, and those say little
            if rng.random() < 0.98:
                continue
        else:
            canonical_seen += 1
        base = canonical(choices) is not None
        for name, groups in CLASSES.items():
            group = next(g for g in groups if choices[name] in g)
            for value in group:
                checked += 1
                if (canonical({**choices, name: value}) is not None) != base:
                    failures += 1
                    examples.append(f"{name}: {choices[name]} → {value} at {choices}")
        free = [*FREE, *(ROPE_FREE if choices["rope"] else ())]
        for name in free:
            for value in AXES[name]:
                checked += 1
                if (canonical({**choices, name: value}) is not None) != base:
                    failures += 1
                    examples.append(f"{name} → {value} at {choices}")
        if base:
            for dtype, qdq in itertools.product(AXES["dtype"], AXES["qdq"]):
                checked += 1
                alone = canonical({"dtype": dtype, "qdq": qdq}) is not None
                if (canonical({**choices, "dtype": dtype, "qdq": qdq}) is not None) != alone:
                    failures += 1
                    examples.append(f"dtype={dtype}, qdq={qdq} at {choices}")
    return {"points": points, "checks": checked, "failures": failures, "examples": examples[:5]}


def draw(count: int, seed: int) -> tuple[list[Variant], int]:
    """``count`` spellings uniformly from the space: draws from the product kept when canonical (distinct
    spellings: a repeat is drawn again). Each gets a head size drawn uniformly and a weight seed."""
    rng = random.Random(seed)
    axes = _space_axes()
    drawn: list[Variant] = []
    seen: set[tuple] = set()
    tries = 0
    while len(drawn) < count:
        tries += 1
        choices = {name: rng.choice(values) for name, values in axes.items()}
        variant = canonical(choices)
        if variant is None or tuple(choices.values()) in seen:
            continue
        seen.add(tuple(choices.values()))
        head_dim = rng.choice(AXES["head_dim"])
        drawn.append(Variant(**{**asdict(variant), "head_dim": head_dim, "seed": rng.randrange(2**16)}))
    return drawn, tries


# --- running the tools ------------------------------------------------------------------------------------------


def _fused_attention_ops(model: Any) -> int:
    return sum("Attention" in node.op_type for node in model.graph.node)


def run_tool(tool: str, variant: Variant) -> dict[str, Any]:
    """One tool on one spelling: fused (the block became a fused op; for egfuse's ``npu`` target, single-head
    attention) and correct (``egfuse.testing.disagreements`` finds nothing)."""
    import warnings

    import onnx

    from egfuse.testing import attention_model, disagreements, feeds_for

    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    model = attention_model(variant)
    try:
        if tool.startswith("egfuse"):
            import egfuse

            result = egfuse.fuse(model, target=tool.split(":")[1])
            optimized, fused = result.model, result.report.fused
        elif tool == "onnxscript":
            import onnx_ir as ir
            from onnxscript.rewriter.ort_fusions import optimize_for_ort

            ir_model, _ = optimize_for_ort(ir.from_proto(model))
            optimized = ir.serde.serialize_model(ir_model)
            fused = _fused_attention_ops(optimized)
        elif tool == "ort":
            from onnxruntime.transformers.optimizer import optimize_model

            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model.onnx")
                onnx.save(model, path)
                optimized = optimize_model(
                    path, model_type="bert", num_heads=variant.heads, hidden_size=variant.hidden
                ).model
            fused = _fused_attention_ops(optimized)
        else:
            raise ValueError(f"unknown tool {tool}")
    except Exception as error:  # a tool that fails on a spelling does not fuse it
        return {"fused": False, "correct": False, "reason": f"{type(error).__name__}: {error}"[:200],
                "seconds": round(time.perf_counter() - start, 3)}  # fmt: skip
    if not fused:
        return {
            "fused": False,
            "correct": False,
            "reason": "not fused",
            "seconds": round(time.perf_counter() - start, 3),
        }
    problems = disagreements(
        model, optimized, feeds_for(model, seed=variant.seed + 7, batch=3, seq=6, left_padding=True)
    )
    return {
        "fused": True,
        "correct": not problems,
        "reason": problems[0][:200] if problems else "",
        "seconds": round(time.perf_counter() - start, 3),
    }


def _run_variant(variant: Variant, tools: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {tool: run_tool(tool, variant) for tool in tools}


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in sorted([*(ROOT / "egfuse").rglob("*.py"), *(ROOT / "rules").glob("*.py")]):
        digest.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    for package in ("onnxscript", "onnxruntime", "onnx", "egglog"):
        digest.update(f"{package}={_version(package)}".encode())
    return digest.hexdigest()[:16]


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "missing"


def _key(variant: Variant) -> str:
    return json.dumps(asdict(variant), sort_keys=True)


def outcomes(sample: list[Variant], tools: tuple[str, ...], jobs: int, cache_path: Path) -> list[dict[str, Any]]:
    """Every tool on every sampled spelling, resumed from the cache; a crashed worker is a row, not the end."""
    fingerprint = _fingerprint()
    cache: dict[str, dict] = {}
    if cache_path.exists():
        for line in cache_path.read_text().splitlines():
            row = json.loads(line)
            if row.get("fingerprint") == fingerprint:
                cache[row["key"]] = row["outcome"]
    todo = [v for v in sample if not all(t in cache.get(_key(v), {}) for t in tools)]
    print(f"{len(sample) - len(todo)} of {len(sample)} spellings cached; running {len(todo)}", flush=True)
    start, done = time.perf_counter(), 0
    with cache_path.open("a") as out:
        while todo:
            try:
                with ProcessPoolExecutor(jobs, max_tasks_per_child=50) as pool:
                    futures = {pool.submit(_run_variant, v, tools): v for v in todo}
                    for future in as_completed(futures):
                        variant = futures[future]
                        outcome = {**cache.get(_key(variant), {}), **future.result()}
                        cache[_key(variant)] = outcome
                        out.write(
                            json.dumps({"fingerprint": fingerprint, "key": _key(variant), "outcome": outcome}) + "\n"
                        )
                        out.flush()
                        done += 1
                        if done % 50 == 0 or done == len(todo):
                            rate = (time.perf_counter() - start) / done
                            print(
                                f"  {done}/{len(todo)} spellings, {rate:.1f} s each, "
                                f"~{rate * (len(todo) - done) / 60:.0f} min left",
                                flush=True,
                            )
                todo = []
            except BrokenProcessPool:  # a tool crashed its process: its spelling is recorded as a crash
                crashed = [v for v in todo if _key(v) not in cache]
                if crashed:
                    victim = crashed[0]
                    cache[_key(victim)] = {
                        t: {"fused": False, "correct": False, "reason": "the process crashed"} for t in tools
                    }
                todo = [v for v in todo if _key(v) not in cache]
    return [cache[_key(v)] for v in sample]


# --- results ----------------------------------------------------------------------------------------------------


def summarise(sample: list[Variant], rows: list[dict[str, Any]], tools: tuple[str, ...]) -> dict[str, Any]:
    coverage = {}
    for tool in tools:
        fused = sum(r[tool]["fused"] for r in rows)
        correct = sum(r[tool]["fused"] and r[tool]["correct"] for r in rows)
        coverage[tool] = {
            "covered": correct,
            "fused": fused,
            "fused_wrong": fused - correct,
            "share": round(correct / len(rows), 4),
        }
    per_axis: dict[str, dict[str, dict[str, Any]]] = {}
    for name in _space_axes():
        per_axis[name] = {}
        for value in AXES[name]:
            picked = [r for v, r in zip(sample, rows, strict=True) if getattr(v, name) == value]
            if not picked:
                continue
            per_axis[name][json.dumps(value)] = {
                "samples": len(picked),
                **{t: round(sum(r[t]["fused"] and r[t]["correct"] for r in picked) / len(picked), 4) for t in tools},
            }
    reasons: dict[str, dict[str, int]] = {}
    for tool in tools:
        counts: dict[str, int] = {}
        for r in rows:
            if not (r[tool]["fused"] and r[tool]["correct"]):
                reason = r[tool]["reason"].split(":")[0][:80] if r[tool]["fused"] is False else "fused, outputs differ"
                counts[reason] = counts.get(reason, 0) + 1
        reasons[tool] = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:6])
    return {"coverage": coverage, "per_axis": per_axis, "reasons": reasons}


def markdown(result: dict[str, Any]) -> str:
    tools = result["tools"]
    space = result["space"]
    lines = [
        "# The variant space (variant_space)",
        "",
        f"{len(space['axes'])} axes of attention spelling from the property-test generator (`egfuse.testing.AXES`; "
        "sizes aside); a spelling is a canonical choice on every axis (`egfuse.testing.canonical`).",
        "",
        f"- **space size: {space['space_size']:,} spellings** (exact; the product of the axes is "
        f"{space['product_of_axes']:,}, most of it choices that cannot combine or that another choice makes "
        "meaningless; "
        f"counted over {space['enumerated_points']:,} class points in {space['seconds']} s)",
        f"- counting verified on {result['verify']['points']} random points: {result['verify']['checks']:,} "
        "class swaps and free-axis "
        f"changes, {result['verify']['failures']} that changed the verdict",
        f"- sample: **{result['samples']:,} spellings** drawn uniformly (seed {result['seed']}, "
        f"{result['draws']:,} draws from the product)",
        "",
        "## Coverage on the uniform sample (fused **and** correct)",
        "",
        "| tool | covered | fused but wrong |",
        "|---|---|---|",
    ]
    for tool in tools:
        c = result["coverage"][tool]
        lines.append(f"| {tool} | {100 * c['share']:.1f}% ({c['covered']}/{result['samples']}) | {c['fused_wrong']} |")
    lines += [
        "",
        "## Per axis value",
        "",
        "| axis | value | samples | " + " | ".join(tools) + " |",
        "|---|---|---|" + "---|" * len(tools),
    ]
    for name, values in result["per_axis"].items():
        for value, cell in values.items():
            lines.append(
                f"| {name} | {json.loads(value)} | {cell['samples']} | "
                + " | ".join(f"{100 * cell[t]:.0f}%" for t in tools)
                + " |"
            )
    lines += ["", "## Most common reasons a spelling is not covered", ""]
    for tool in tools:
        lines.append(
            f"- **{tool}**: " + "; ".join(f"{reason or '(none)'} ×{n}" for reason, n in result["reasons"][tool].items())
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tools = result["tools"]
    axes_shown = [name for name, values in result["per_axis"].items() if len(values) > 1]
    figure, axis = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(tools)
    for index, tool in enumerate(tools):
        lows = [min(cell[tool] for cell in result["per_axis"][name].values()) for name in axes_shown]
        axis.bar([i + index * width for i in range(len(axes_shown))], [100 * v for v in lows], width, label=tool)
    axis.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(axes_shown))], axes_shown, rotation=60, ha="right", fontsize=8
    )
    axis.set_ylabel("coverage at the axis's worst value (%)")
    axis.set_title(f"{result['samples']} spellings drawn uniformly from {result['space']['space_size']:.2e}")
    axis.legend(fontsize=8, ncol=len(tools))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--verify", action="store_true", help="only check the counting's classes and free axes")
    parser.add_argument("--cache", type=Path, default=RESULTS / ".variant_space_cache.jsonl")
    args = parser.parse_args(argv)
    checked = verify(300, args.seed)
    print(f"counting verified: {checked['checks']:,} checks, {checked['failures']} failures", flush=True)
    if args.verify:
        print(json.dumps(checked, indent=1))
        raise SystemExit(1 if checked["failures"] else 0)
    space = space_size(args.jobs)
    print(f"space: {space['space_size']:,} spellings ({space['seconds']} s)", flush=True)
    sample, tries = draw(args.samples, args.seed)
    tools = tuple(args.tools)
    rows = outcomes(sample, tools, args.jobs, args.cache)
    result = {
        "tools": list(tools),
        "seed": args.seed,
        "samples": len(sample),
        "draws": tries,
        "space_size": space["space_size"],
        "space": space,
        "verify": checked,
        **summarise(sample, rows, tools),
        "versions": {p: _version(p) for p in ("egglog", "onnx", "onnxruntime", "onnxscript")},
        "seconds_per_spelling": {t: round(sum(r[t].get("seconds", 0) for r in rows) / len(rows), 3) for t in tools},
    }
    (RESULTS / "variant_space.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "variant_space.md").write_text(markdown(result))
    drawn = plot(result, RESULTS / "variant_space.png")
    print(markdown(result))
    print("wrote results/variant_space.{json,md}" + (" and .png" if drawn else ""))


if __name__ == "__main__":
    main()
