"""One egglog e-graph, loaded fast and read back fast.

egglog-python's typed API is how rules are *written* (``rules/``). For *loading* thousands of graph values
it is too slow (building terms re-walks shared subterms), and one huge program string is quadratic in
egglog's parser. So terms are issued as small egglog-text batches with the constructor names egglog-python
registered, and read back through ``freeze()``. The language and the rules themselves come as egglog text too
(:mod:`egfuse.egraph.egg_program`: made once through egglog-python, replayed from the text). This module and that one
are the only ones that touch those internals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import egglog
from egglog import bindings

from egfuse.egraph import egg_cache, egg_program, rule_reach
from egfuse.egraph.egg_program import egg_names, flat_declarations

__all__ = ["EClass", "ENode", "RunStats", "Session", "egg_names", "flat_declarations"]


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
        found = egg_program.known()
        if found is None:  # the first e-graph since the sources changed: loaded through egglog-python
            made = egg_program.make()
            self._use(made.egraph, made.base)
        else:
            self._use(egglog.EGraph(), found[0])
            egg_program.run_commands(self._raw, found[0].commands)
        self._ruleset: egglog.Ruleset | None = None
        self._rule_names_of: dict[str, str] = {}
        self._run_command: bindings._Command | None = None
        self._added = False
        self.rules_loaded: int | None = None
        """Rules this session loaded (None: all, through egglog-python)."""

    def _use(self, egraph: egglog.EGraph, base: egg_cache.Base) -> None:
        self.egraph = egraph
        self._raw: bindings.EGraph = egraph._egraph
        self._sort = base.sort
        self._sized = base.sized
        self.names: dict[str, str] = dict(base.names)
        self._python_name = {egg: py for py, egg in self.names.items()}
        self._constructors = egg_program.constructor_names(self.names)
        """The egglog names of the language's constructors: what :mod:`~egfuse.egraph.rule_reach` reads terms by."""
        (self._print_size,) = self._raw.parse_program("(print-size)")

    def _sort_name(self) -> str:
        return self._sort

    # --- loading ---------------------------------------------------------------------------------------------
    def add(self, commands: list[str]) -> None:
        self._added = True
        egg_program.run_commands(self._raw, commands)

    def size(self) -> int:
        """Rows of the language's functions (what egglog-python's ``all_function_sizes`` counts)."""
        (output,) = self._raw.run_program(self._print_size)
        return sum(n for name, n in output.sizes if name in self._sized)

    def holds(self, fact: str) -> bool:
        """Whether egglog can match ``fact`` (a query in its syntax; free names are pattern variables) now."""
        try:
            self._raw.run_program(*self._raw.parse_program(f"(check {fact})"))
        except bindings.EggSmolError:
            return False
        return True

    def constructors_in(self, commands: list[str]) -> set[str]:
        """The constructors (egglog names) ``commands`` call: what :meth:`register` keeps the rules for."""
        return rule_reach.constructors_in(commands, self._constructors)

    # --- saturation ------------------------------------------------------------------------------------------
    def register(self, ruleset: egglog.Ruleset, present: set[str] | None = None) -> None:
        """Loads the rules now rather than on the first run: a session pushed before its terms and popped after
        keeps them for the next use. One ruleset a session. Replayed from their text where it is known —
        given the constructors the terms to come are made of (``present``, egglog names:
        :meth:`constructors_in`), only the rules that can fire on them (:mod:`egfuse.egraph.rule_reach`);
        otherwise loaded through egglog-python (into a fresh e-graph, which this session takes where nothing was
        added to its own yet), as every later session's text."""
        if self._ruleset is ruleset:
            return
        if self._ruleset is not None:
            raise ValueError("a session runs one ruleset; this one already has another")
        found = egg_program.known(ruleset)
        if found is not None:
            rules = found[1]
            assert rules is not None
            commands = rules.commands
            if present is not None:
                commands = rule_reach.firing(commands, self._constructors, present, rules.reach or None)
            self.rules_loaded = sum(rule_reach.is_rule(c) for c in commands)
            egg_program.run_commands(self._raw, commands)
            self._rule_names_of = rules.rule_names
        else:
            made = egg_program.make(ruleset)
            rules = made.rules
            assert rules is not None
            if not self._added and not self.egraph._state_stack:  # nothing of this session's own yet
                self._use(made.egraph, made.base)
                self._rule_names_of = made.rule_names
            elif made.faithful:
                egg_program.run_commands(self._raw, rules.commands)
                self._rule_names_of = rules.rule_names
            else:  # never seen (egglog 13.2 prints what it reads)
                raise RuntimeError("egglog's printing of the rules does not read back as the same commands")
        self._ruleset = ruleset
        self._sized = rules.sized
        (self._run_command,) = self._raw.parse_program(rules.run)

    def run(self, ruleset: egglog.Ruleset, *, max_iterations: int, max_enodes: int, max_seconds: float) -> RunStats:
        """Run one iteration at a time: egglog's ``run`` has no node or time budget of its own."""
        self.register(ruleset)
        stats = RunStats(enodes_before=self.size())
        start = time.perf_counter()
        stats.stop_reason = "iteration budget"
        command = self._run_command
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
        """egglog's name of a rule (egglog-python's counter where this session's rules were loaded through it;
        replayed from text, a rule's ``:name`` or a rewrite's own text) → the rule's stable name (its family
        and place in the family)."""
        stable = self._rule_names_of

        def named(egg_name: str) -> str:
            return stable.get(egg_name, f"unnamed.{egg_name}")

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
