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
import multiprocessing
import os
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT))

from fingerprint import package_version, source_fingerprint  # noqa: E402

from egfuse.commands.fanout import Crashed, fan_out  # noqa: E402
from egfuse.testing import AXES, Variant, canonical  # noqa: E402

_SPAWN = multiprocessing.get_context("spawn")
"""Workers are started fresh: forked from a process that has run onnxruntime, they can hang on its threads."""

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


GROUPS = (("past", "cache_read"), ("rope", "rope_tables", "rope_seq_first"))
"""Axes enumerated together: the later ones mean something only when the first is on (else at their
defaults, as a canonical form has them), so their other values are never tried there."""


def _factors() -> list[tuple[tuple[str, ...], list[tuple[tuple[Any, ...], int]]]]:
    """The enumeration's factors: (axis names, [(values, weight)]) — a group's meaningful combinations, or
    one axis's classes."""
    default = asdict(Variant())
    grouped = {name for group in GROUPS for name in group}
    factors = []
    for group in GROUPS:
        rest = group[1:]
        combos = [((False, *(default[n] for n in rest)), 1)]
        combos += [((True, *values), 1) for values in itertools.product(*(AXES[n] for n in rest))]
        factors.append((group, combos))
    for name in _enumerated():
        if name not in grouped:
            factors.append(((name,), [((value,), weight) for value, weight in _values(name)]))
    return factors


def _count_chunk(chunk: tuple[int, int]) -> tuple[int, int]:
    """Spellings (weighted) and canonical class points with the first two factors at the choices ``chunk``
    indexes."""
    factors = _factors()
    free = math.prod(len(AXES[n]) for n in FREE) * _paired_count()
    rope_free = math.prod(len(AXES[n]) for n in ROPE_FREE)
    total = points = 0
    fixed = [(factors[i][0], factors[i][1][chunk[i]]) for i in range(2)]
    for combo in itertools.product(*(choices for _, choices in factors[2:])):
        choices: dict[str, Any] = {}
        weight = 1
        for names, (values, w) in [*fixed, *zip((names for names, _ in factors[2:]), combo, strict=True)]:
            choices.update(zip(names, values, strict=True))
            weight *= w
        if canonical(choices) is None:
            continue
        total += weight * free * (rope_free if choices["rope"] else 1)
        points += 1
    return total, points


def space_size(jobs: int) -> dict[str, Any]:
    """The exact count, one process per value of the first enumerated axis."""
    start = time.perf_counter()
    factors = _factors()
    with ProcessPoolExecutor(jobs, mp_context=_SPAWN) as pool:
        chunks = itertools.product(range(len(factors[0][1])), range(len(factors[1][1])))
        parts = list(pool.map(_count_chunk, chunks))
    product = math.prod(len(v) for v in _space_axes().values())
    size = sum(total for total, _ in parts)
    return {
        "space_size": size,
        "product_of_axes": product,
        "axes": {name: len(values) for name, values in _space_axes().items()},
        "enumerated_points": math.prod(len(choices) for _, choices in factors),
        "canonical_points": sum(points for _, points in parts),
        "seconds": round(time.perf_counter() - start, 1),
    }


def _space_key() -> str:
    """What the count depends on: the generator's axes and repair, and this counting's classes."""
    digest = hashlib.sha256((ROOT / "egfuse" / "testing" / "variant.py").read_bytes())
    digest.update(repr((CLASSES, FREE, ROPE_FREE, PAIRED, SIZES, GROUPS)).encode())
    return "space:" + digest.hexdigest()[:16]


def _counted(cache_path: Path, jobs: int) -> dict[str, Any]:
    """The space's size, counted once per version of the axes and of this counting (about 20 min on one core)
    and kept in the cache file beside the tools' outcomes — or taken from the results file, which records the
    key of the count it holds (a fresh clone has no cache)."""
    key = _space_key()
    if cache_path.exists():
        for line in cache_path.read_text().splitlines():
            row = json.loads(line)
            if row.get("key") == key:
                return row["space"]
    try:
        recorded = json.loads((RESULTS / "variant_space.json").read_text())["space"]
    except (OSError, ValueError, KeyError):
        recorded = {}
    if recorded.get("key") == key:
        return recorded
    space = {**space_size(jobs), "key": key}
    with cache_path.open("a") as out:
        out.write(json.dumps({"key": key, "space": space}) + "\n")
    return space


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
    egraph: dict[str, Any] = {}
    model = attention_model(variant)
    try:
        if tool.startswith("egfuse"):
            import egfuse

            result = egfuse.fuse(model, target=tool.split(":")[1])
            optimized, fused = result.model, result.report.fused
            stats = result.report.stats
            egraph = {key: stats.get(key) for key in _EGRAPH_STATS} | {"nodes": len(model.graph.node)}
            why = [f"{r.status}: {r.reason}" for r in result.report.regions if r.status != "fused"]
            egraph["egfuse_reason"] = (why[0] if why else f"{len(result.report.regions)} regions")[:200]
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
        reason = f"not fused ({egraph['egfuse_reason']})" if "egfuse_reason" in egraph else "not fused"
        seconds = round(time.perf_counter() - start, 3)
        return {"fused": False, "correct": False, "reason": reason[:200], "seconds": seconds, **egraph}
    problems = disagreements(
        model, optimized, feeds_for(model, seed=variant.seed + 7, batch=3, seq=6, left_padding=True)
    )
    return {
        "fused": True,
        "correct": not problems,
        "reason": problems[0][:200] if problems else "",
        "seconds": round(time.perf_counter() - start, 3),
        **egraph,
    }


_EGRAPH_STATS = ("enodes_before", "enodes_after", "iterations", "stop_reason", "seconds_saturate")


def _run_variant(variant: Variant, tools: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {tool: run_tool(tool, variant) for tool in tools}


def _key(variant: Variant) -> str:
    return json.dumps(asdict(variant), sort_keys=True)


def outcomes(
    sample: list[Variant], tools: tuple[str, ...], jobs: int, cache_path: Path, minutes: float | None = None
) -> list[dict[str, Any] | None]:
    """Every tool on every sampled spelling, resumed from the cache; a crashed worker is a row, not the end.
    Past ``minutes`` the spellings not yet run are left (None) and a later run resumes from the cache; the
    summary takes the longest finished prefix of the draws (:func:`main`)."""
    fingerprint = source_fingerprint(("onnxscript", "onnxruntime", "onnx", "egglog"))
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
        for index, result in fan_out(_run_variant, [(v, tools) for v in todo], workers=jobs):
            variant = todo[index]
            if isinstance(result, Exception):  # the process crashed (or the harness failed): a row, not the end
                reason = "the process crashed" if isinstance(result, Crashed) else f"{type(result).__name__}: {result}"
                result = {t: {"fused": False, "correct": False, "reason": reason[:200]} for t in tools}
            outcome = {**cache.get(_key(variant), {}), **result}
            cache[_key(variant)] = outcome
            out.write(json.dumps({"fingerprint": fingerprint, "key": _key(variant), "outcome": outcome}) + "\n")
            out.flush()
            done += 1
            if done % 50 == 0 or done == len(todo):
                rate = (time.perf_counter() - start) / done
                print(
                    f"  {done}/{len(todo)} spellings, {rate:.1f} s each, ~{rate * (len(todo) - done) / 60:.0f} min"
                    " left",
                    flush=True,
                )
            if minutes is not None and time.perf_counter() - start > 60 * minutes:
                print(f"  stopped after {minutes} min: the rest resumes from the cache", flush=True)
                break
    return [cache[_key(v)] if all(t in cache.get(_key(v), {}) for t in tools) else None for v in sample]


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
    examples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    default = asdict(Variant())
    for tool in tools:
        counts: dict[str, int] = {}
        examples[tool] = {}
        for variant, r in zip(sample, rows, strict=True):
            if not (r[tool]["fused"] and r[tool]["correct"]):
                text = r[tool]["reason"] if r[tool]["fused"] is False else "fused, outputs differ"
                reason = re.sub(r"\d[\d.e+-]*", "N", text)[:100]
                counts[reason] = counts.get(reason, 0) + 1
                if tool.startswith("egfuse") and len(examples[tool].setdefault(reason, [])) < 3:
                    choices = {k: v for k, v in asdict(variant).items() if v != default[k]}
                    examples[tool][reason].append(choices)
        reasons[tool] = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:6])
        examples[tool] = {k: v for k, v in examples[tool].items() if k in reasons[tool]}
    return {
        "coverage": coverage,
        "per_axis": per_axis,
        "reasons": reasons,
        "examples": examples,  # the choices (off the defaults) of a few spellings per reason, to reproduce
        "egraph": egraph_cost(rows, tools),
    }


BLOCK_BANDS = ("≤ 40 nodes", "41–80 nodes", "> 80 nodes")
"""The block sizes (ONNX nodes) the e-graph cost is broken down by, in order."""


def egraph_cost(rows: list[dict[str, Any]], tools: tuple[str, ...]) -> dict[str, Any]:
    """Per egfuse target: the e-graph's size and saturation work over the sample, against the block's size
    (its node count), how often saturation stopped on a budget instead of saturating, and coverage there."""
    out: dict[str, Any] = {}
    for tool in (t for t in tools if t.startswith("egfuse")):
        runs = [r[tool] for r in rows if r[tool].get("enodes_after") is not None]
        if not runs:
            continue
        budget = [r for r in runs if r["stop_reason"] != "saturated"]
        by_size: dict[str, list[dict]] = {}
        for r in runs:
            band = BLOCK_BANDS[0] if r["nodes"] <= 40 else BLOCK_BANDS[1] if r["nodes"] <= 80 else BLOCK_BANDS[2]
            by_size.setdefault(band, []).append(r)
        out[tool] = {
            "runs": len(runs),
            "enodes_after": _spread([r["enodes_after"] for r in runs]),
            "growth": _spread([r["enodes_after"] / max(1, r["enodes_before"]) for r in runs]),
            "iterations": _spread([r["iterations"] for r in runs]),
            "seconds_saturate": _spread([r["seconds_saturate"] for r in runs]),
            "budget_hit": len(budget),
            "stop_reasons": {k: sum(r["stop_reason"] == k for r in runs) for k in {r["stop_reason"] for r in runs}},
            "covered_when_budget_hit": sum(r["fused"] and r["correct"] for r in budget),
            "by_block_size": {
                band: {
                    "runs": len(group),
                    "enodes_after": _spread([r["enodes_after"] for r in group]),
                    "seconds_saturate": _spread([r["seconds_saturate"] for r in group]),
                    "covered": round(sum(r["fused"] and r["correct"] for r in group) / len(group), 4),
                }
                for band, group in sorted(by_size.items())
            },
        }
    return out


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    median, p90 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9))
    return {"median": round(median, 4), "p90": round(p90, 4), "max": round(ordered[-1], 4)}


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
        f"{result['draws']:,} draws from the product"
        + (
            f"; {result['samples']:,} of {result['drawn']:,} drawn had run when the time given ran out — which ones "
            "finish does not depend on their outcome, so they are a uniform sample too)"
            if result["samples"] < result.get("drawn", result["samples"])
            else ")"
        ),
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
    lines += ["", "## E-graph cost over the sample", ""]
    header = (
        "| target | e-nodes after saturation (median / p90 / max) | growth | iterations | saturate s (median / max) "
    )
    lines += [header + "| budget hit | covered when hit |", "|---|---|---|---|---|---|---|"]
    for tool, e in result["egraph"].items():
        n, g, it, sec = e["enodes_after"], e["growth"], e["iterations"], e["seconds_saturate"]
        lines.append(
            f"| {tool} | {n['median']:.0f} / {n['p90']:.0f} / {n['max']:.0f} | {g['median']:.2f}× | {it['median']:.0f} "
            f"(max {it['max']:.0f}) | {sec['median']:.2f} / {sec['max']:.2f} | {e['budget_hit']} of {e['runs']} | "
            f"{e['covered_when_budget_hit']} |"
        )
    lines += ["", "Against the block's size (its ONNX node count):", ""]
    lines += ["| target | block | spellings | e-nodes after (median / max) | saturate s (median / max) | covered |"]
    lines += ["|---|---|---|---|---|---|"]
    for tool, e in result["egraph"].items():
        for band in BLOCK_BANDS:
            if (b := e["by_block_size"].get(band)) is not None:
                n, sec = b["enodes_after"], b["seconds_saturate"]
                lines.append(
                    f"| {tool} | {band} | {b['runs']} | {n['median']:.0f} / {n['max']:.0f} | "
                    f"{sec['median']:.2f} / {sec['max']:.2f} | {100 * b['covered']:.0f}% |"
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
    parser.add_argument("--minutes", type=float, help="stop running tools after this long; summarise what finished")
    args = parser.parse_args(argv)
    checked = verify(300, args.seed)
    print(f"counting verified: {checked['checks']:,} checks, {checked['failures']} failures", flush=True)
    if args.verify:
        print(json.dumps(checked, indent=1))
        raise SystemExit(1 if checked["failures"] else 0)
    space = _counted(args.cache, args.jobs)
    print(f"space: {space['space_size']:,} spellings (counted in {space['seconds']} s)", flush=True)
    sample, tries = draw(args.samples, args.seed)
    tools = tuple(args.tools)
    rows = outcomes(sample, tools, args.jobs, args.cache, args.minutes)
    # The longest run of draws all finished, in draw order: the draws are independent, so it is a uniform
    # sample whatever finished first (fast spellings finish sooner, and speed is not independent of outcome).
    prefix = next((i for i, r in enumerate(rows) if r is None), len(rows))
    sample, rows = sample[:prefix], [r for r in rows[:prefix] if r is not None]
    result = {
        "tools": list(tools),
        "seed": args.seed,
        "samples": len(sample),
        "drawn": args.samples,
        "draws": tries,
        "space_size": space["space_size"],
        "space": space,
        "verify": checked,
        **summarise(sample, rows, tools),
        "versions": {p: package_version(p) for p in ("egglog", "onnx", "onnxruntime", "onnxscript")},
        "seconds_per_spelling": {t: round(sum(r[t].get("seconds", 0) for r in rows) / len(rows), 3) for t in tools},
    }
    (RESULTS / "variant_space.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "variant_space.md").write_text(markdown(result))
    drawn = plot(result, RESULTS / "variant_space.png")
    print(markdown(result))
    print("wrote results/variant_space.{json,md}" + (" and .png" if drawn else ""))


if __name__ == "__main__":
    main()
