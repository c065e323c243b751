"""Rules vs patterns (issue 20, item 2): how much matching machinery each tool carries for attention, and
what each of egfuse's rule families buys — every number measured here, none typed in.

Four measurements, one section each:

1. ``egfuse_rules`` — egfuse's rules per family, counted from the egglog rulesets themselves
   (``egfuse.rules.NAMED``; the declarations :func:`egfuse.rules.rule_names` names), fact rules apart.
2. ``onnxscript_patterns`` — the rule objects of the attention and RoPE rule sets that onnxscript's
   ``optimize_for_ort`` applies (found by parsing ``fuse_xformers`` and reading each ``fuse_*`` closure), and the
   concrete spellings each carries: every consistent choice of its ``OrValue`` alternatives, enumerated and
   de-duplicated. Also what ``RewriteRule.commute()`` generates for each, by calling it.
3. ``ort_paths`` — onnxruntime's python transformers optimizer: the parent paths its attention fusions try,
   counted by parsing each module with :mod:`ast` (the counting rule is in :func:`ort_paths`).
4. ``ablation`` — coverage (every attention block fused *and* validated) of a fixed-seed sample of spellings
   from egfuse's own generator (``egfuse.testing.variants()``, the property tests' strategy), ``--target ort``,
   with all rules, with each core family removed, and as families are added one by one.

    .venv/bin/python experiments/rules_vs_patterns.py      # ~6 min on 2 cores; a rerun resumes from its cache

Writes results/rules_vs_patterns.{json,md} and results/rules_vs_patterns.png (when matplotlib imports). The
ablation's per-variant outcomes are cached in the system temp dir, keyed by a fingerprint of egfuse's and the
rules' sources, so a rerun after an interruption resumes and a rerun after a change to egfuse recomputes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from egglog import unstable_combine_rulesets  # noqa: E402
from fingerprint import package_version, source_fingerprint  # noqa: E402

import egfuse  # noqa: E402
import egfuse.search  # noqa: E402
from egfuse import rules  # noqa: E402
from egfuse.targets import get_target  # noqa: E402
from egfuse.testing import Variant, attention_model, feeds_for  # noqa: E402

RESULTS = HERE / "results"
NAME = "rules_vs_patterns"
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "egfuse_rules_vs_patterns" / "cache.json"
TARGET = "ort"

CUMULATIVE_ORDER: tuple[str, ...] = (
    "facts", "commute", "layout", "attention", "scale", "masks", "precision", "softcap", "clamp", "heads",
    "heads.weights", "windows", "groups", "qbias", "pieces", "norms", "gelu", "tanh_gelu", "rotary",
)  # fmt: skip
"""The order families are added in for the cumulative curve: what others read first (facts: the conditions;
commute: the canonical operand order every pattern assumes; layout), then the identity itself (``attention``),
then the spellings around it — scale, masks, precision, soft-capping, clamps, folded heads (and the weights
fact they need), windows and grouped heads, query-dependent biases, attention in pieces; last the norm and GELU
families (issue 19; the tanh GELU's, issue 36) and RoPE's, which no attention spelling needs: their rows show
that (the RoPE column counts the rotations fused)."""

ONNXSCRIPT_FUSIONS = (
    "onnxscript.rewriter.ort_fusions.sdpa",
    "onnxscript.rewriter.ort_fusions.gqa",
    "onnxscript.rewriter.ort_fusions.gqa_packed_qkv",
    "onnxscript.rewriter.ort_fusions.mha",
    "onnxscript.rewriter.ort_fusions.mha_scale",
    "onnxscript.rewriter.ort_fusions.mha_bias",
    "onnxscript.rewriter.ort_fusions.attention",
    "onnxscript.rewriter.ort_fusions.sdpa_via_mha",
    "onnxscript.rewriter.ort_fusions.rotary_embedding",
    "onnxscript.rewriter.ort_fusions.cos_sin_cache",
)
"""The ort_fusions modules whose rules recognise attention or RoPE; of the ``fuse_*`` calls ``fuse_xformers``
makes, those defined in these modules are counted (the rest are GELU, normalisations, softmax upcasts)."""

ROTARY_MODULES = ("rotary_embedding", "cos_sin_cache")

# --- 1. egfuse's rules -------------------------------------------------------------------------------------------


def _rule_decls(ruleset: Any) -> list[Any]:
    """A family's rule declarations, as :func:`egfuse.rules.rule_names` reads them (egglog-python's own)."""
    return list(ruleset.__egg_decls__._rulesets[ruleset.ident].rules)


def egfuse_rules() -> dict[str, Any]:
    """Rules per family from the rulesets, with the kind of each (``rewrite``, ``birewrite``: one rule both ways,
    ``rule``: a Datalog-style rule), fact rules (family ``facts``) apart from rewrite rules."""
    families: dict[str, dict[str, Any]] = {}
    for family, ruleset in rules.NAMED.items():
        decls = _rule_decls(ruleset)
        kinds = Counter(type(d).__name__.removesuffix("Decl").lower() for d in decls)
        families[family] = {
            "rules": len(decls),
            "kinds": dict(sorted(kinds.items())),
            "core": family in rules.CORE_FAMILIES,
            "role": "facts" if family == "facts" else "rewrite",
        }
    total = sum(f["rules"] for f in families.values())
    facts = sum(f["rules"] for f in families.values() if f["role"] == "facts")
    return {
        "families": families,
        "total": total,
        "fact_rules": facts,
        "rewrite_rules": total - facts,
        "core_total": sum(f["rules"] for f in families.values() if f["core"]),
        "named_by_rule_names": len(rules.rule_names()),
        "source": "rules/*.py (egfuse.rules.NAMED)",
    }


# --- 2. onnxscript's patterns ------------------------------------------------------------------------------------


def _attention_fusions() -> list[tuple[str, str, Any]]:
    """``(fusion_count key, function name, rule set)`` for each ``fuse(...)`` call in ``fuse_xformers``' source
    (what ``optimize_for_ort`` runs), in call order, whose rules come from an attention or RoPE module."""
    from onnxscript.rewriter.ort_fusions import _core

    found: list[tuple[str, str, Any]] = []
    for node in ast.walk(ast.parse(inspect.getsource(_core.fuse_xformers))):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call, target = node.value, node.targets[0]
        if not (isinstance(call.func, ast.Name) and call.func.id == "fuse" and isinstance(call.args[0], ast.Name)):
            continue
        key = (
            target.slice.value if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) else "?"
        )
        rule_set = inspect.getclosurevars(getattr(_core, call.args[0].id)).nonlocals.get("rules")
        if rule_set is not None and _module_of(rule_set) is not None:
            found.append((str(key), call.args[0].id, rule_set))
    return found


def _rules_of(rule_set: Any) -> list[Any]:
    return list(getattr(rule_set, "rules", [rule_set]))


def _module_of(rule_set: Any) -> str | None:
    """The ort_fusions module (one of :data:`ONNXSCRIPT_FUSIONS`) a rule set's rules were written in, or None."""
    modules = {_rule_class(rule).__module__ for rule in _rules_of(rule_set)} & set(ONNXSCRIPT_FUSIONS)
    return min(modules) if modules else None


def _rule_class(rule: Any) -> type:
    """The pattern class a rule was made from (``SDPA.rule()`` keeps the instance's bound ``rewrite``)."""
    function = rule._replacement_pattern._function
    return type(function.__self__) if hasattr(function, "__self__") else type(function)


def _spellings(graph_pattern: Any) -> set[str]:
    """Every concrete spelling of a pattern graph: each ``OrValue`` (``BacktrackingOr``/``OpIdDispatchOr``) takes
    one alternative, the same one wherever it is reached; each choice is rendered as an expression of the ops,
    attributes and operand order it matches, and equal renderings are one spelling."""
    from onnxscript.rewriter import _pattern_ir as p

    def alternatives(value: Any) -> list[Any] | None:
        if isinstance(value, p.BacktrackingOr):
            return list(value._values)
        if isinstance(value, p.OpIdDispatchOr):
            return [pattern for _, pattern in value._op_to_pattern.values()]
        return None

    def render(value: Any, chosen: dict[int, int]) -> Iterator[tuple[str, dict[int, int]]]:
        options = alternatives(value)
        if options is not None:
            if id(value) in chosen:
                yield from render(options[chosen[id(value)]], chosen)
            else:
                for index, option in enumerate(options):
                    yield from render(option, {**chosen, id(value): index})
        elif isinstance(value, p.NodeOutputPattern):
            node = value.producer()
            partial: list[tuple[list[str], dict[int, int]]] = [([], chosen)]
            for operand in node.inputs:
                partial = [([*done, text], now) for done, so_far in partial for text, now in render(operand, so_far)]
            attributes = ",".join(f"{k}={v}" for k, v in sorted(node.attributes.items()))
            head = f"{node.domain}.{node.op}[{attributes}]#{value.output_index}"
            for operands, now in partial:
                yield f"{head}({', '.join(operands)})", now
        elif value is None:
            yield "None", chosen
        elif isinstance(value, p.Constant):
            yield repr(value.value), chosen
        elif isinstance(value, p.AnyValue):
            yield "_", chosen
        else:
            yield f"${value.name}", chosen

    combined: list[tuple[list[str], dict[int, int]]] = [([], {})]
    for output in graph_pattern.outputs:
        combined = [([*done, text], now) for done, so_far in combined for text, now in render(output, so_far)]
    return {" | ".join(texts) for texts, _ in combined}


def _or_values(graph_pattern: Any) -> int:
    """The disjunctions (``OrValue``) a pattern's nodes read."""
    seen = {id(v) for n in graph_pattern for v in n.inputs if type(v).__name__ in ("BacktrackingOr", "OpIdDispatchOr")}
    seen |= {id(v) for v in graph_pattern.outputs if type(v).__name__ in ("BacktrackingOr", "OpIdDispatchOr")}
    return len(seen)


def onnxscript_patterns() -> dict[str, Any]:
    """Per rule set ``optimize_for_ort`` applies for attention and RoPE, and per rule in it: the rule objects as
    used (none of these sets is built with ``commute=True``, and onnxscript's matcher tries operands only in the
    written order), the concrete spellings they carry, and what ``RewriteRule.commute()`` generates when called —
    rules, and distinct spellings over all of them."""
    import onnxscript

    sets: list[dict[str, Any]] = []
    for key, function, rule_set in _attention_fusions():
        module = (_module_of(rule_set) or "?").rsplit(".", 1)[-1]
        rows = []
        for rule in _rules_of(rule_set):
            pattern = rule._target_pattern
            commuted = rule.commute()
            union: set[str] = set()
            for each in commuted:
                union |= _spellings(each._target_pattern)
            rows.append({
                "rule": rule.name or _rule_class(rule).__name__,
                "class": _rule_class(rule).__name__,
                "pattern_nodes": len(list(pattern)),
                "or_values": _or_values(pattern),
                "spellings": len(_spellings(pattern)),
                "commute_rules": len(commuted),
                "commute_spellings": len(union),
            })  # fmt: skip
        sets.append({
            "fusion": key,
            "function": function,
            "module": f"{module}.py",
            "kind": "rotary" if module in ROTARY_MODULES else "attention",
            "rules_as_used": len(rows),
            **{f: sum(r[f] for r in rows) for f in ("spellings", "commute_rules", "commute_spellings")},
            "rules": rows,
        })  # fmt: skip
    fields = ("rules_as_used", "spellings", "commute_rules", "commute_spellings")
    per_class: dict[str, dict[str, Any]] = {}
    for s in sets:
        for r in s["rules"]:
            entry = per_class.setdefault(
                r["class"], {"module": s["module"], "kind": s["kind"], **dict.fromkeys(fields, 0)}
            )
            entry["rules_as_used"] += 1
            for f in fields[1:]:
                entry[f] += r[f]
    totals = {
        kind: {f: sum(s[f] for s in sets if kind == "all" or s["kind"] == kind) for f in fields}
        for kind in ("attention", "rotary", "all")
    }
    sdpa = next(s for s in sets if s["module"] == "sdpa.py")
    return {
        "onnxscript_version": onnxscript.__version__,
        "source": "onnxscript/rewriter/ort_fusions/*.py (installed package): the rule sets fuse_xformers applies",
        "rule_sets": sets,
        "per_class": per_class,
        "totals": totals,
        "sdpa": {f: sdpa[f] for f in fields},
    }


# --- 3. onnxruntime's match paths --------------------------------------------------------------------------------


def _is_op_list(node: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.List | ast.Tuple)
        and bool(node.elts)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    )


def _is_index_list(node: ast.AST | None) -> bool:
    return isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and (e.value is None or isinstance(e.value, int)) for e in node.elts
    )


def _literal(node: ast.AST | None) -> tuple[Any, ...] | None:
    """A list's items as values; an item that is an expression (``0 if x else 1``) as its source text."""
    if not isinstance(node, ast.List | ast.Tuple):
        return None
    items: list[Any] = []
    for item in node.elts:
        try:
            items.append(ast.literal_eval(item))
        except ValueError:
            items.append(ast.unparse(item))
    return tuple(items)


def _argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _paths_in(scope: ast.AST) -> tuple[list[tuple[tuple[Any, ...], tuple[Any, ...] | None]], int]:
    """The parent paths one scope tries, and its ``match_parent_path*`` calls. A path is (op types, input
    indices): (a) the literal op-type list of a ``match_parent_path`` call; (b) each literal ``(ops, indices)``
    entry of the path list given to ``match_parent_paths``/``match_parent_paths_all`` (each list one path); (c) a
    literal ``(ops, indices)`` pair elsewhere — a table a loop feeds to ``match_parent_path`` (the call itself,
    whose op argument is then not a literal, adds nothing)."""
    paths: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]] = []
    in_lists: set[int] = set()
    calls = 0
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == "match_parent_path":
            calls += 1
            ops = _argument(node, 1, "parent_op_types")
            if _is_op_list(ops):
                paths.append((_literal(ops) or (), _literal(_argument(node, 2, "parent_input_index"))))
        elif node.func.attr in ("match_parent_paths", "match_parent_paths_all"):
            calls += 1
            listed = _argument(node, 1, "paths")
            in_lists |= {id(sub) for sub in ast.walk(listed)} if listed is not None else set()
            for entry in getattr(listed, "elts", []):
                if isinstance(entry, ast.List | ast.Tuple) and entry.elts and _is_op_list(entry.elts[0]):
                    paths.append(
                        (_literal(entry.elts[0]) or (), _literal(entry.elts[1]) if len(entry.elts) > 1 else None)
                    )
    for node in ast.walk(scope):
        if (
            isinstance(node, ast.Tuple)
            and id(node) not in in_lists
            and len(node.elts) == 2
            and _is_op_list(node.elts[0])
            and _is_index_list(node.elts[1])
        ):
            paths.append((_literal(node.elts[0]) or (), _literal(node.elts[1])))
    return paths, calls


def _scopes(tree: ast.Module, word: str, exclude: str | None = None) -> list[tuple[str, ast.AST]]:
    """Classes whose name holds ``word`` (all their methods), and functions (methods of other classes, or
    top-level) whose name holds it — case-insensitively; ``exclude`` drops names that hold that word."""

    def wanted(name: str) -> bool:
        return word in name.lower() and not (exclude and exclude in name.lower())

    found: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            if wanted(node.name):
                found.append((node.name, node))
                continue
            found += [
                (f"{node.name}.{item.name}", item)
                for item in node.body
                if isinstance(item, ast.FunctionDef) and wanted(item.name)
            ]
        elif isinstance(node, ast.FunctionDef) and wanted(node.name):
            found.append((node.name, node))
    return found


def ort_paths() -> dict[str, Any]:
    """The parent paths onnxruntime's transformers optimizer tries to match attention (and, apart, RoPE), per
    module of ``onnxruntime/transformers/`` (``fusion_*attention*.py``, ``fusion_mha*.py``, ``onnx_model*.py``:
    the attention fusions and the model classes that carry their own), parsed with :mod:`ast`. A
    module's attention scope is its classes named ``*Attention*`` and its functions named ``*attention*``; RoPE's
    is ``*Rotary*`` outside those. Paths are counted by :func:`_paths_in`; ``distinct`` counts equal
    (ops, indices) pairs of one module once, and the total sums modules."""
    import onnxruntime

    root = Path(onnxruntime.__file__).parent / "transformers"
    files = sorted({*root.glob("fusion_*attention*.py"), *root.glob("fusion_mha*.py"), *root.glob("onnx_model*.py")})
    modules: dict[str, dict[str, Any]] = {}
    for kind, word, exclude in (("attention", "attention", None), ("rotary", "rotary", "attention")):
        for path in files:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            paths: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]] = []
            calls, scopes = 0, []
            for name, scope in _scopes(tree, word, exclude):
                found, n_calls = _paths_in(scope)
                if n_calls or found:
                    scopes.append(name)
                paths += found
                calls += n_calls
            if not paths:
                continue
            modules[f"{kind}:{path.name}"] = {
                "module": path.name,
                "kind": kind,
                "scopes": scopes,
                "calls": calls,
                "paths": len(paths),
                "distinct": len(set(paths)),
            }
    totals = {
        kind: {
            f: sum(m[f] for m in modules.values() if m["kind"] == kind)
            for f in ("modules", "calls", "paths", "distinct")
            if f != "modules"
        }
        | {"modules": sum(m["kind"] == kind for m in modules.values())}
        for kind in ("attention", "rotary")
    }
    return {
        "onnxruntime_version": onnxruntime.__version__,
        "source": "onnxruntime/transformers/{fusion_*attention*,fusion_mha*,onnx_model*}.py (installed package), ast",
        "modules": list(modules.values()),
        "totals": totals,
        "counting_rule": (
            "a path is one (op types, input indices) alternative: the literal op list of a match_parent_path "
            "call, each entry of the list given to match_parent_paths/_all, or a literal (ops, indices) pair in a "
            "table a loop feeds to match_parent_path; only code in classes named *Attention* and functions named "
            "*attention* counts (RoPE: *Rotary* outside them); distinct = equal pairs of one module once"
        ),
    }


# --- 4. ablation -------------------------------------------------------------------------------------------------


def draw_variants(count: int, seed: int) -> list[Variant]:
    """``count`` distinct spellings, each an independent draw of the property tests' own strategy
    (``egfuse.testing.variants()``) from hypothesis's primitive provider seeded by ``random.Random(f"{seed}:{i}")``.
    Not the sequence ``@given`` walks under ``hypothesis.seed``: that engine starts from the simplest choices and
    mutates what it drew, so its first draws are correlated (under seed 20 its first 80 never drew a KV cache).
    Reads hypothesis internals (``ConjectureData``, ``BuildContext``: as of hypothesis 6.170)."""
    from hypothesis.control import BuildContext
    from hypothesis.internal.conjecture.data import ConjectureData

    from egfuse.testing import variants

    strategy, index = variants(), 0
    drawn: list[Variant] = []
    while len(drawn) < count:
        data = ConjectureData(random=random.Random(f"{seed}:{index}"))
        with BuildContext(data, is_final=True, wrapped_test=draw_variants):
            variant = data.draw(strategy)
        if variant not in drawn:
            drawn.append(variant)
        index += 1
    return drawn


def _choices(variant: Variant) -> dict[str, Any]:
    """A variant's choices that differ from :class:`Variant`'s defaults (the classic BERT export)."""
    default = Variant()
    return {f.name: getattr(variant, f.name) for f in dataclasses.fields(variant)
            if getattr(variant, f.name) != getattr(default, f.name)}  # fmt: skip


@functools.cache
def _ruleset(core: tuple[str, ...], families: tuple[str, ...]) -> Any:
    """The union of some core families and a target's own families, built once per combination (egglog-python
    gathers a new ruleset object's declarations once per e-graph it meets)."""
    parts = [rules.CORE_FAMILIES[name] for name in core] + [rules.FAMILIES[name] for name in families]
    return unstable_combine_rulesets(*parts)  # flat: a union of unions costs twice as much per level


def _rule_count(core: tuple[str, ...]) -> int:
    """Rules in a configuration: its core families and the target's own (``ort``), as the rulesets hold them."""
    names = [*core, *get_target(TARGET).rule_families]
    return sum(len(_rule_decls(rules.NAMED[name])) for name in names)


@contextlib.contextmanager
def _only(core: tuple[str, ...] | None, identical: list[bool]) -> Iterator[None]:
    """Run the pipeline with only these core families (None: the library's own ruleset, unpatched). Patches
    ``egfuse.search.ruleset_for`` (what the search saturates with and hands the certifier) and wraps
    ``egfuse.search.Certifier`` to record, per region search, whether the certifier got that same ruleset."""
    original_for, original_certifier = egfuse.search.ruleset_for, egfuse.search.Certifier
    expected: dict[tuple[str, ...], Any] = {}

    def ruleset_for(families: tuple[str, ...]) -> Any:
        expected[families] = _ruleset(core, families) if core is not None else original_for(families)
        return expected[families]

    class Recording(original_certifier):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            bound = inspect.signature(original_certifier.__init__).bind(self, *args, **kwargs)
            identical.append(any(bound.arguments["ruleset"] is r for r in expected.values()))
            super().__init__(*args, **kwargs)

    egfuse.search.ruleset_for, egfuse.search.Certifier = ruleset_for, Recording
    try:
        yield
    finally:
        egfuse.search.ruleset_for, egfuse.search.Certifier = original_for, original_certifier


def _outcome(variant: Variant) -> dict[str, Any]:
    """One spelling fused for the target with validation on the property tests' feeds: covered when its one
    attention block is the one region, fused, and the model validated."""
    start = time.perf_counter()
    try:
        model = attention_model(variant)
        result = egfuse.fuse(model, target=TARGET, feeds=feeds_for(model, seed=variant.seed))
    except Exception as error:  # a removed family may leave the pipeline unable to go on: a row, not the end
        return {"covered": False, "error": f"{type(error).__name__}: {error}"[:200],
                "seconds": round(time.perf_counter() - start, 3)}  # fmt: skip
    report = result.report
    covered = len(report.regions) == 1 and report.fused == 1 and report.validated is True
    reason = None
    if not covered:
        reasons = [r.reason for r in report.regions if r.status != "fused" and r.reason]
        reason = (reasons[0] if reasons else report.validation_note or f"{len(report.regions)} regions")[:200]
    stats = report.stats
    return {
        "covered": covered,
        "fused": report.fused,
        "regions": len(report.regions),
        "validated": report.validated,
        "reason": reason,
        "seconds": round(time.perf_counter() - start, 3),
        # the e-graph's cost with this rule set (20.4: cost against the number of rules)
        "enodes": stats.get("enodes_after"),
        "iterations": stats.get("iterations"),
        "saturate_seconds": stats.get("seconds_saturate"),
        "budget_hit": stats.get("stop_reason") not in (None, "saturated"),
        "rotations": len(report.rotary),
        "rotations_fused": sum(r.status == "fused" for r in report.rotary),
    }


def _source_tree() -> dict[str, Any]:
    """The commit the ablation ran on and whether egfuse/ or rules/ differed from it (others may be editing)."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return run.stdout.strip()

    changed = git("status", "--porcelain", "--", "egfuse", "rules").splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "uncommitted_files_in_egfuse_or_rules": len(changed)}


class Cache:
    """Outcomes per (configuration, variant) in one JSON file, for the current fingerprint only."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path, self.fingerprint = path, fingerprint
        stored: dict[str, Any] = {}
        if path.exists():
            with contextlib.suppress(ValueError):
                stored = json.loads(path.read_text())
        self.entries: dict[str, dict[str, Any]] = stored.get(fingerprint, {}) if isinstance(stored, dict) else {}

    def get(self, config: str, variant: str) -> dict[str, Any] | None:
        return self.entries.get(config, {}).get(variant)

    def put(self, config: str, variant: str, outcome: dict[str, Any]) -> None:
        self.entries.setdefault(config, {})[variant] = outcome

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({self.fingerprint: self.entries}))
        temporary.replace(self.path)


def _run_config(
    core: tuple[str, ...] | None, sample: list[Variant], cache: Cache, identical: list[bool]
) -> list[dict[str, Any]]:
    """Every variant of the sample under one configuration, from the cache where it holds them."""
    key = "library" if core is None else ",".join(core) or "-"
    outcomes: list[dict[str, Any]] = []
    with _only(core, identical):
        for variant in sample:
            outcome = cache.get(key, repr(variant))
            if outcome is None:
                outcome = _outcome(variant)
                cache.put(key, repr(variant), outcome)
            outcomes.append(outcome)
    cache.save()
    return outcomes


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def _cost(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """The e-graph's cost over the sample with one rule set: median e-nodes after saturation, iterations and
    saturation seconds, and how many blocks hit a budget (iterations, e-nodes or time) before saturating."""
    ran = [o for o in outcomes if o.get("enodes") is not None]
    return {
        "median_enodes": _median([o["enodes"] for o in ran]),
        "median_iterations": _median([o["iterations"] for o in ran if o.get("iterations") is not None]),
        "median_saturate_ms": _median(
            [round(1000 * o["saturate_seconds"], 1) for o in ran if o.get("saturate_seconds")]
        ),
        "budget_hits": sum(bool(o.get("budget_hit")) for o in ran),
    }


def _lost_choices(lost: list[int], sample: list[Variant]) -> list[str]:
    """The choices most over-represented among lost variants (count among them vs in the whole sample)."""
    everywhere = Counter(f"{k}={v}" for variant in sample for k, v in _choices(variant).items())
    among = Counter(f"{k}={v}" for i in lost for k, v in _choices(sample[i]).items() if k != "seed")
    ranked = sorted(among, key=lambda c: (-among[c] / everywhere[c], -among[c], c))
    return [f"{c} ({among[c]}/{everywhere[c]})" for c in ranked if among[c] >= max(1, len(lost) // 2)][:3]


def ablation(count: int, seed: int, cache_path: Path) -> dict[str, Any]:
    """Coverage of a fixed-seed sample with all rules, with each core family removed (its drop and which
    variants it loses), and cumulatively as :data:`CUMULATIVE_ORDER` adds families; plus the library's own
    unpatched ruleset as a check that the patch is faithful, and whether the certifier got the same ruleset."""
    start = time.perf_counter()
    sample = draw_variants(count, seed)
    cache = Cache(cache_path, source_fingerprint(("egglog", "onnxruntime", "onnx", "onnx-ir")))
    core_all = tuple(rules.CORE_FAMILIES)
    assert sorted(CUMULATIVE_ORDER) == sorted(core_all), "the cumulative order must list every core family once"
    identical: list[bool] = []

    def covered(outcomes: list[dict[str, Any]]) -> set[int]:
        return {i for i, o in enumerate(outcomes) if o["covered"]}

    def row(core: tuple[str, ...], outcomes: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(covered(outcomes))
        rotations = {k: sum(o.get(k, 0) for o in outcomes) for k in ("rotations", "rotations_fused")}
        return {"rules": _rule_count(core), "covered": n, "coverage": round(n / len(sample), 4), **rotations,
                **_cost(outcomes)}  # fmt: skip

    everything = _run_config(core_all, sample, cache, identical)
    library = _run_config(None, sample, cache, identical)
    base = covered(everything)
    removed = []
    for family in core_all:
        core = tuple(f for f in core_all if f != family)
        outcomes = _run_config(core, sample, cache, identical)
        lost, gained = sorted(base - covered(outcomes)), sorted(covered(outcomes) - base)
        removed.append({
            "family": family,
            "family_rules": len(_rule_decls(rules.CORE_FAMILIES[family])),
            **row(core, outcomes),
            "drop": len(base) - len(covered(outcomes)),
            "lost": lost,
            "gained": gained,
            "lost_choices": _lost_choices(lost, sample),
            "errors": sum("error" in o for o in outcomes),
        })  # fmt: skip
    cumulative = [{"added": None, **row((), _run_config((), sample, cache, identical))}]
    for k, family in enumerate(CUMULATIVE_ORDER, start=1):
        core = tuple(f for f in core_all if f in CUMULATIVE_ORDER[:k])  # the library's order within a union
        cumulative.append({"added": family, **row(core, _run_config(core, sample, cache, identical))})
    computed = [o["seconds"] for config in cache.entries.values() for o in config.values()]
    return {
        "target": TARGET,
        "seed": seed,
        "variants": len(sample),
        "drawn_by": "egfuse.testing.variants(), one hypothesis draw per random.Random(f'{seed}:{i}'), distinct",
        "criterion": "covered: the block is the one region, fused, and report.validated is True (property feeds)",
        "all_rules": row(core_all, everything),
        "library_ruleset": {
            **row(core_all, library),
            "same_outcomes": [o["covered"] for o in library] == [o["covered"] for o in everything],
        },
        "certifier_same_ruleset": {"checked": len(identical), "identical": sum(identical)},
        "removed": removed,
        "cumulative_order": list(CUMULATIVE_ORDER),
        "cumulative": cumulative,
        "uncovered_with_all_rules": [
            {
                "index": i,
                "choices": _choices(sample[i]),
                "reason": everything[i].get("reason") or everything[i].get("error"),
            }
            for i in sorted(set(range(len(sample))) - base)
        ],
        "sample": [_choices(v) for v in sample],
        "fuse_seconds_total": round(sum(computed), 1),
        "seconds": round(time.perf_counter() - start, 1),
    }


# --- writing -----------------------------------------------------------------------------------------------------


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def markdown(results: dict[str, Any]) -> str:
    """The four tables, each with how its numbers were made."""
    e, o, p, a = (results[k] for k in ("egfuse_rules", "onnxscript_patterns", "ort_paths", "ablation"))
    lines = [
        "# Rules vs patterns",
        "",
        f"Written by `experiments/rules_vs_patterns.py` ({results['run_seconds']:.0f} s; "
        + ", ".join(f"{k} {v}" for k, v in results["versions"].items())
        + f"; egfuse at {results['source_tree']['commit']}, "
        + f"{results['source_tree']['uncommitted_files_in_egfuse_or_rules']} files of egfuse/ and rules/ changed "
        + "since). Every number below is measured by that script.",
        "",
        "## egfuse's rules",
        "",
        "| family | rules | kinds | |",
        "|---|---:|---|---|",
    ]
    for name, f in e["families"].items():
        kinds = ", ".join(f"{k} {v}" for k, v in f["kinds"].items())
        role = "fact rules" if f["role"] == "facts" else ("core" if f["core"] else "target `ort`")
        lines.append(f"| `{name}` | {f['rules']} | {kinds} | {role} |")
    lines += [
        f"| **total** | **{e['total']}** | {e['fact_rules']} fact rules + {e['rewrite_rules']} rewrite rules | |",
        "",
        "Counted from the egglog rulesets themselves (`egfuse.rules.NAMED`: each family's rule declarations, as "
        f"`rule_names()` names them — {e['named_by_rule_names']} names). A `birewrite` is one rule used both ways; "
        "`rule` is a Datalog-style rule (a fact, or a union under a condition). The `facts` family derives the "
        "conditions other rules read (`scalar_of`, `rank_of`, `finite`); the rest rewrite.",
        "",
        f"## onnxscript's attention patterns (onnxscript {o['onnxscript_version']})",
        "",
        "| `fuse_xformers` step | module | rule (class) | rules as used | concrete spellings | `commute()` rules | "
        "`commute()` spellings |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for s in o["rule_sets"]:
        for r in s["rules"]:
            rule = r["rule"] if r["rule"] == r["class"] else f"{r['rule']} ({r['class']})"
            lines.append(
                f"| `{s['fusion']}` | {s['module']} | {rule} | 1 | {r['spellings']} | {r['commute_rules']} | "
                f"{r['commute_spellings']} |"
            )
    for kind, t in o["totals"].items():
        lines.append(
            f"| **{kind}** | | | **{t['rules_as_used']}** | **{t['spellings']}** | **{t['commute_rules']}** | "
            f"**{t['commute_spellings']}** |"
        )
    sdpa = o["sdpa"]
    lines += [
        "",
        "The rule sets are those `optimize_for_ort` applies (the `fuse(...)` calls of `fuse_xformers`, each "
        "`fuse_*` closure's `RewriteRuleSet`), restricted to attention and RoPE modules. A rule's concrete "
        "spellings are its `OrValue` alternatives chosen every consistent way, enumerated and de-duplicated by "
        "rendering (ops, attributes, operand order). None of these sets is built with `commute=True` and the "
        "matcher tries operands only in the written order, so the rules as used match exactly their spellings; "
        "`commute()` is called on each rule to show what the expansion would generate (distinct spellings over "
        f"all its patterns: a swap inside an alternative not taken changes nothing). The SDPA rule: "
        f"{sdpa['rules_as_used']} rule object, {sdpa['spellings']} concrete spellings as used; "
        f"`commute()` makes {sdpa['commute_rules']} rules with {sdpa['commute_spellings']} distinct spellings.",
        "",
        f"## onnxruntime's attention match paths (onnxruntime {p['onnxruntime_version']})",
        "",
        "| module | kind | scopes | match calls | paths | distinct paths |",
        "|---|---|---|---:|---:|---:|",
    ]
    for m in p["modules"]:
        scopes = ", ".join(f"`{s}`" for s in m["scopes"])
        lines.append(f"| {m['module']} | {m['kind']} | {scopes} | {m['calls']} | {m['paths']} | {m['distinct']} |")
    for kind, t in p["totals"].items():
        modules = f"{t['modules']} module{'s' if t['modules'] != 1 else ''}"
        lines.append(f"| **{kind}** ({modules}) | | | **{t['calls']}** | **{t['paths']}** | "
                     f"**{t['distinct']}** |")  # fmt: skip
    lines += [
        "",
        "Counted by parsing `onnxruntime/transformers/{fusion_*attention*, fusion_mha*, onnx_model*}.py` with "
        "`ast`, in classes named `*Attention*` and functions named `*attention*` (RoPE: `*Rotary*` outside "
        "them). A path is one alternative the fusion tries: the literal op-type list of a `match_parent_path` "
        "call, each entry of the path list given to `match_parent_paths`/`match_parent_paths_all` (each list "
        "one path), or a literal `(ops, indices)` pair of a table a loop feeds to `match_parent_path` "
        "(`FusionAttention`'s `qk_paths`). `distinct` counts equal (ops, indices) pairs of one module once; the "
        "totals sum the modules.",
        "",
        f"## Ablation: what each egfuse family buys (target `{a['target']}`, {a['variants']} spellings, "
        f"seed {a['seed']})",
        "",
        f"All rules: **{a['all_rules']['covered']}/{a['variants']}** covered ({_percent(a['all_rules']['coverage'])},"
        f" {a['all_rules']['rules']} rules; RoPE: {a['all_rules'].get('rotations_fused', '–')} of "
        f"{a['all_rules'].get('rotations', '–')} rotations fused). The library's own ruleset, unpatched: "
        f"{a['library_ruleset']['covered']}/{a['variants']} (same outcome per spelling: "
        f"{'yes' if a['library_ruleset']['same_outcomes'] else 'NO'}). The certifier received the patched ruleset "
        f"in {a['certifier_same_ruleset']['identical']} of {a['certifier_same_ruleset']['checked']} searches.",
        "",
        "| removed family | its rules | rules left | covered | coverage | drop | RoPE fused | choices most lost "
        "(lost/in sample) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in a["removed"]:
        choices = "every covered spelling" if r["drop"] == a["all_rules"]["covered"] else "; ".join(r["lost_choices"])
        choices += f"; gains {len(r['gained'])}" if r["gained"] else ""
        rope = f"{r.get('rotations_fused', '–')}/{r.get('rotations', '–')}"
        lines.append(f"| `{r['family']}` | {r['family_rules']} | {r['rules']} | {r['covered']} | "
                     f"{_percent(r['coverage'])} | {r['drop']} | {rope} | {choices} |")  # fmt: skip
    lines += ["", "Cumulative (families added in this order; the target's own `ort` family is always present), with "
              "the e-graph's cost over the sample at each step (medians; budget hits: blocks whose saturation "
              "stopped at a budget):", "",
              "| added | rules | covered | coverage | e-nodes | iterations | saturate ms | budget hits |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in a["cumulative"]:
        lines.append(f"| {('`' + c['added'] + '`') if c['added'] else '(ort only)'} | {c['rules']} | {c['covered']} | "
                     f"{_percent(c['coverage'])} | {c.get('median_enodes', '–')} | {c.get('median_iterations', '–')} | "
                     f"{c.get('median_saturate_ms', '–')} | {c.get('budget_hits', '–')} |")  # fmt: skip
    lines += [
        "",
        "The sample is the property tests' own strategy (`egfuse.testing.variants()`), each spelling an "
        f"independent draw from hypothesis's provider seeded by `random.Random(f'{a['seed']}:{{i}}')`, "
        f"{a['variants']} distinct ones (not the correlated sequence `@given` walks). "
        "A spelling is covered when its one attention block is the "
        "one region, fused, and `report.validated` is true (`egfuse.fuse(model, target='ort')` on the property "
        "tests' feeds). A family is removed by patching `egfuse.search.ruleset_for` to return the union of the "
        "other core families and the target's own; the certifier is handed that same ruleset by the search "
        "(checked per search above). Uncovered with all rules:",
        "",
    ]
    lines += [f"- #{u['index']} {u['choices']}: {u['reason']}" for u in a["uncovered_with_all_rules"]] or ["- none"]
    lines += ["", results["figure_note"], ""]
    return "\n".join(lines)


def figure(results: dict[str, Any], path: Path) -> str:
    """Counts side by side, the drop per removed family, and the cumulative curve; or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No figure: matplotlib does not import in this environment (`pip install matplotlib` to get it)."
    e, o, p, a = (results[k] for k in ("egfuse_rules", "onnxscript_patterns", "ort_paths", "ablation"))
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 5.6))
    bars = {
        "egfuse rewrite rules": e["rewrite_rules"],
        "egfuse fact rules": e["fact_rules"],
        "onnxscript attention rules": o["totals"]["attention"]["rules_as_used"],
        "onnxscript spellings": o["totals"]["attention"]["spellings"],
        "onnxscript commute() spellings": o["totals"]["attention"]["commute_spellings"],
        "onnxruntime paths (distinct)": p["totals"]["attention"]["distinct"],
    }
    left.barh(list(bars)[::-1], list(bars.values())[::-1], color="tab:blue")
    for y, value in enumerate(list(bars.values())[::-1]):
        left.text(value, y, f" {value}", va="center")
    left.set_title("attention matching machinery (counts)")
    families = [r["family"] for r in a["removed"]]
    middle.bar(families, [r["drop"] for r in a["removed"]], color="tab:red")
    middle.set_title(f"coverage lost when one family is removed (of {a['variants']})")
    middle.set_xticks(range(len(families)), families, rotation=60, ha="right")
    steps = range(len(a["cumulative"]))
    right.plot(steps, [100 * c["coverage"] for c in a["cumulative"]], marker="o")
    labels = [f"+{c['added'] or 'ort only'} ({c['rules']})" for c in a["cumulative"]]
    right.set_xticks(steps, labels, rotation=60, ha="right", fontsize=8)
    right.set_xlabel("families added in order (rules so far)")
    right.set_ylabel("coverage (%)")
    right.set_title("cumulative coverage")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"Figure: `experiments/results/{path.name}` (counts, per-family drop, cumulative curve)."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=int, default=100, help="spellings in the ablation sample (default 100)")
    parser.add_argument("--seed", type=int, default=20, help="seed of the sample's draws (default 20)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="outcome cache (default: system temp dir)")
    parser.add_argument(
        "--render", action="store_true", help="rewrite the .md and .png from the existing .json, measuring nothing"
    )
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads((RESULTS / f"{NAME}.json").read_text())
        results["figure_note"] = figure(results, RESULTS / f"{NAME}.png")
        (RESULTS / f"{NAME}.md").write_text(markdown(results))
        return
    start = time.perf_counter()
    results: dict[str, Any] = {
        "egfuse_rules": egfuse_rules(),
        "onnxscript_patterns": onnxscript_patterns(),
        "ort_paths": ort_paths(),
    }
    print("counted rules, patterns and paths; ablation running …", flush=True)
    results["ablation"] = ablation(args.variants, args.seed, args.cache)
    results["versions"] = {name: package_version(name) for name in ("egfuse", "egglog", "onnxscript", "onnxruntime")}
    results["source_tree"] = _source_tree()
    results["run_seconds"] = round(time.perf_counter() - start, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results["figure_note"] = figure(results, RESULTS / f"{NAME}.png")
    (RESULTS / f"{NAME}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (RESULTS / f"{NAME}.md").write_text(markdown(results))
    a = results["ablation"]
    print(
        f"egfuse rules {results['egfuse_rules']['total']}, onnxscript attention spellings "
        f"{results['onnxscript_patterns']['totals']['attention']['spellings']}, onnxruntime attention paths "
        f"{results['ort_paths']['totals']['attention']['paths']}; coverage {a['all_rules']['covered']}/"
        f"{a['variants']} ({results['run_seconds']:.0f} s)"
    )


if __name__ == "__main__":
    main()
