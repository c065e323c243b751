"""One egglog e-graph, loaded fast and read back fast.

egglog-python's typed API is how rules are *written* (``rules/``). For *loading* thousands of graph values
it is too slow (building terms re-walks shared subterms), and one huge program string is quadratic in
egglog's parser. So terms are issued as small egglog-text batches with the constructor names egglog-python
registered, and read back through ``freeze()``. This module is the only one that touches those internals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import egglog
from egglog import bindings
from egglog.declarations import Declarations

from egfuse.egraph import lang

_BATCH = 64  # commands per parse: egglog's parser is quadratic in one program's length


_FLAT_DECLS: dict[int, tuple[object, Declarations]] = {}


def flat_declarations(*objects: object) -> Declarations:
    """The declarations of typed objects (a ruleset, the language's constructors) merged once, by identity.
    egglog-python gathers them anew on every ``_add_decls`` — through runtime protocol checks, tens of
    thousands of calls, about half a second an e-graph — though they never change."""
    key = hash(tuple(id(o) for o in objects))
    if key not in _FLAT_DECLS:
        _FLAT_DECLS[key] = (objects, Declarations.create(*objects))  # the objects kept: their ids stay theirs
    return _FLAT_DECLS[key][1]


def egg_names(egraph: egglog.EGraph, fns: dict[str, object]) -> dict[str, str]:
    """The egglog-level names of typed constructors/functions, registering them with ``egraph``."""
    egraph._add_decls(flat_declarations(*fns.values()))  # once: each call re-merges every declaration
    return {name: egraph._state.callable_ref_to_egg(fn.__egg_ref__)[0] for name, fn in fns.items()}


@dataclass
class RunStats:
    iterations: int = 0
    seconds: float = 0.0
    enodes_before: int = 0
    enodes_after: int = 0
    stop_reason: str = ""
    matches: int = 0
    rule_matches: dict[str, int] = field(default_factory=dict)
    """Matches per rule, by the rule's stable name (``masks.12``; :func:`egfuse.rules.rule_names`)."""


class EClass(int):
    """An e-class id (kept apart from i64 arguments, which are plain ints)."""

    def __repr__(self) -> str:
        return f"e{int(self)}"


@dataclass(frozen=True)
class ENode:
    op: str  # the constructor's Python name, e.g. "matmul"
    args: tuple  # EClass for Tensor children, Python values (int, float, str) for primitives
    children: tuple[EClass, ...] = ()  # the EClass entries of args (kept: extraction reads them often)

    @staticmethod
    def of(op: str, args: tuple) -> ENode:
        return ENode(op, args, tuple(a for a in args if isinstance(a, EClass)))


class Session:
    """An e-graph over the language in :mod:`egfuse.egraph.lang`, with the perm tables already loaded."""

    def __init__(self) -> None:
        self.egraph = egglog.EGraph()
        self._raw: bindings.EGraph = self.egraph._egraph
        functions = {name: getattr(lang.Tensor, name) for name in lang.constructor_names()}
        for fact in (
            "scalar_of",
            "rank_of",
            "dtype_of",
            "dim_of",
            "perm_then",
            "swap_last2",
            "is_weight",
            "finite",
            "head_invariant",
            "heads_of",
            "last_dim",
            "halves_repeat",
        ):
            functions[fact] = getattr(lang, fact)
        self.names: dict[str, str] = egg_names(self.egraph, functions)
        self.names["ref"] = "egfuse_ref"
        self._raw.run_program(*self._raw.parse_program(f"(constructor egfuse_ref (i64) {self._sort_name()})"))
        self._python_name = {egg: py for py, egg in self.names.items()}
        self.add(
            [f'(set ({self.names["perm_then"]} "{a}" "{b}") "{c}")' for a, b, c in lang.perm_table()]
            + [f'(set ({self.names["swap_last2"]} "{a}") "{b}")' for a, b in lang.swap_table()]
        )

    def _sort_name(self) -> str:
        self.egraph._add_decls(flat_declarations(lang.Tensor))
        return self.egraph._state.type_ref_to_egg(lang.Tensor.__egg_tp__.to_just())

    # --- loading ---------------------------------------------------------------------------------------------
    def add(self, commands: list[str]) -> None:
        for i in range(0, len(commands), _BATCH):
            text = "\n".join(commands[i : i + _BATCH])
            self._raw.run_program(*self._raw.parse_program(text))

    def size(self) -> int:
        return sum(n for _, n in self.egraph.all_function_sizes())

    def holds(self, fact: str) -> bool:
        """Whether egglog can match ``fact`` (a query in its syntax; free names are pattern variables) now."""
        try:
            self._raw.run_program(*self._raw.parse_program(f"(check {fact})"))
        except bindings.EggSmolError:
            return False
        return True

    # --- saturation ------------------------------------------------------------------------------------------
    def register(self, ruleset: egglog.Ruleset) -> None:
        """Turns the rules into egglog's commands now rather than on the first run (a quarter second for ~530
        rules): a session pushed before its terms and popped after keeps them for the next use."""
        self.run(ruleset, max_iterations=0, max_enodes=0, max_seconds=0.0)

    def run(self, ruleset: egglog.Ruleset, *, max_iterations: int, max_enodes: int, max_seconds: float) -> RunStats:
        """Run one iteration at a time: egglog's ``run`` has no node or time budget of its own."""
        stats = RunStats(enodes_before=self.size())
        start = time.perf_counter()
        stats.stop_reason = "iteration budget"
        schedule = egglog.run(ruleset)
        self.egraph._add_decls(flat_declarations(ruleset))  # registers the rules once …
        command = self.egraph._state.run_schedule_to_egg(schedule.schedule)  # … then one iteration is one command
        named = self._rule_names()
        for _ in range(max_iterations):
            (output,) = self._raw.run_program(command)
            report = output.report
            stats.iterations += 1
            stats.matches += sum(report.num_matches_per_rule.values())
            for egg_name, count in report.num_matches_per_rule.items():
                if count:
                    name = named(egg_name)
                    stats.rule_matches[name] = stats.rule_matches.get(name, 0) + count
            if not report.updated:
                stats.stop_reason = "saturated"
                break
            size = self.size()
            if size > max_enodes:
                stats.stop_reason = f"node budget ({size} > {max_enodes})"
                break
            if time.perf_counter() - start > max_seconds:
                stats.stop_reason = f"time budget ({max_seconds}s)"
                break
        stats.seconds = time.perf_counter() - start
        stats.enodes_after = self.size()
        return stats

    def _rule_names(self):
        """egglog's rule name ("38", "38=>") → the rule's stable name (its family and place in the family)."""
        from egfuse.rules import rule_names  # the rules import the language, as this module does: no cycle

        decls = self.egraph._state.rule_name_to_command_decl
        stable = rule_names()

        def named(egg_name: str) -> str:
            return stable.get(decls.get(egg_name), f"unnamed.{egg_name}")

        return named

    # --- reading back ----------------------------------------------------------------------------------------
    def freeze(self) -> tuple[dict[EClass, list[ENode]], dict[str, dict[EClass, object]]]:
        """E-classes of Tensor (id → e-nodes) and the fact tables (name → {e-class id: value})."""
        frozen = self._raw.freeze()
        classes: dict[EClass, list[ENode]] = {}
        facts: dict[str, dict[EClass, object]] = {
            "scalar_of": {},
            "rank_of": {},
            "is_weight": {},
            "finite": {},
            "heads_of": {},
            "head_invariant": {},
            "last_dim": {},
            "halves_repeat": {},
        }

        classes_by_value: dict[bindings.Value, EClass] = {}

        def cid(value: bindings.Value) -> EClass:
            found = classes_by_value.get(value)
            if found is None:
                found = classes_by_value[value] = EClass(len(classes_by_value))
            return found

        tensor_sort = self._sort_name()
        convert = {
            "i64": self._raw.value_to_i64,
            "f64": self._raw.value_to_f64,
            "String": self._raw.value_to_string,
        }
        for egg, fn in frozen.functions.items():
            py = self._python_name.get(egg)
            if py is None:
                continue
            if py in facts:
                for row in fn.rows:
                    out = True if fn.output_sort not in convert else convert[fn.output_sort](row.output)
                    facts[py][cid(row.inputs[0])] = out
                continue
            if fn.output_sort != tensor_sort:
                continue
            for row in fn.rows:
                args = tuple(
                    cid(v) if sort == tensor_sort else convert[sort](v)
                    for v, sort in zip(row.inputs, fn.input_sorts, strict=True)
                )
                classes.setdefault(cid(row.output), []).append(ENode.of(py, args))
        return classes, facts
