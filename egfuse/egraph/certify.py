"""Rewrite certificates: for each fused region, the rule applications that put the fused form into the region's
e-class, iteration by iteration — the algebraic half of the region's proof (the numeric half is validation).

egglog keeps no proofs, so the certificate is a rule-application log: the region is lowered alone into an
e-graph of its own and saturated one iteration at a time under the target's rules, and after each iteration
egglog is asked whether the written form (``mha``, ``attend`` …) is now a member of the class of the region's
output. The log up to that iteration is the certificate: every rule named (``family.position``), with how
often it matched. Rules that matched there but did not lead to the form are listed too (a match is not a use),
so the log is a superset of the rewrite chain, never a subset.

Regions that lower to the same terms (the layers of one model) share one saturation: lowering a region alone
numbers its values in the same order, so equal command lists mean equal e-graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import egglog
import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph import egg_program
from egfuse.egraph.enodes import fields
from egfuse.egraph.session import Session
from egfuse.kinds.regions import Region
from egfuse.lowering.lower import Lowerer


@dataclass
class Certificate:
    """How the region's output class came to hold ``form``: rule applications per saturation iteration."""

    form: str
    through: tuple[str, ...]
    """The ops between the form and the region's output in the written program, outermost first."""
    reached_at: int | None
    """The iteration after which ``form`` was in the class (1-based); None: not within the iteration budget."""
    steps: list[dict[str, int]] = field(default_factory=list)
    """Rule name → matches, for iterations 1 … ``reached_at`` (all iterations run where it was not reached)."""

    def totals(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for step in self.steps:
            for name, count in step.items():
                counts[name] = counts.get(name, 0) + count
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def to_json(self) -> dict:
        return {"form": self.form, "through": list(self.through), "reached_at": self.reached_at, "steps": self.steps,
                "rules": self.totals()}  # fmt: skip


@dataclass(frozen=True)
class LoweredRegion:
    """A region lowered alone: its commands and the id of its output (``ref``)."""

    commands: tuple[str, ...]
    output: int
    values: tuple[ir.Value, ...] = field(default=(), compare=False, hash=False)
    """The graph values by id (not part of equality: equal lowerings of two layers hold different values)."""


class Certifier:
    """Certificates for one search: lowering happens before any region is rewritten (:meth:`lower`), the
    saturation when a region's form is known (:meth:`certify`), once per distinct lowering and form."""

    def __init__(self, facts: GraphFacts, opset: int, ruleset: egglog.Ruleset, max_iterations: int) -> None:
        self.facts, self.opset = facts, opset
        self.ruleset, self.max_iterations = ruleset, max_iterations
        self._done: dict[tuple[LoweredRegion, str], Certificate] = {}
        self._session: Session | None = None

    def adopt(self, session: Session) -> None:
        """Certificates run in ``session``, which holds this search's rules and no terms (the search's own
        e-graph, popped back after reading it): its rules are not turned into egglog's commands again."""
        self._session = session

    def _clean_session(self) -> Session:
        """One e-graph for every certificate of the search, its rules registered once (turning ~530 rules into
        egglog's commands costs more than a small region's saturation); each region runs between a push and a
        pop, so it starts from the same empty e-graph a new session has."""
        if self._session is None:
            self._session = Session()
            self._session.register(self.ruleset)
        return self._session

    def lower(self, region: Region) -> LoweredRegion:
        names = _names()
        lowerer = Lowerer(self.facts, names, self.opset)
        lowerer.lower(region)
        output = lowerer.table.id_of(region.main_output)
        return LoweredRegion(tuple(lowerer.table.commands), output, tuple(lowerer.table.values))

    def certify(self, lowered: LoweredRegion, form: str, through: tuple[tuple[str, int], ...] = ()) -> Certificate:
        """``through``: the ops the extracted program applies to the form's result on the way to the region's
        output, outermost first, each with the argument the form's side takes (a (B, N, S, H) ``attend`` is
        ``merge_heads(transpose(attend(…)))`` of a (B, S, D) output): the class must hold that term."""
        key = (lowered, form, through)
        if key not in self._done:
            self._done[key] = self._saturate(lowered, form, through)
        return self._done[key]

    def _saturate(self, lowered: LoweredRegion, form: str, through: tuple[tuple[str, int], ...]) -> Certificate:
        session = self._clean_session()
        session.egraph.push()
        try:
            return self._saturated(session, lowered, form, through)
        finally:
            session.egraph.pop()

    def _saturated(
        self, session: Session, lowered: LoweredRegion, form: str, through: tuple[tuple[str, int], ...]
    ) -> Certificate:
        session.add(list(lowered.commands))
        pattern = f"({session.names[form]} {' '.join(f'x{i}' for i in range(len(fields(form))))})"
        for depth, (op, position) in enumerate(reversed(through)):
            args = [f"y{depth}_{i}" for i in range(len(fields(op)))]
            args[position] = pattern
            pattern = f"({session.names[op]} {' '.join(args)})"
        member = f"(= ({session.names['ref']} {lowered.output}) {pattern})"
        limit = session.size() * 8 + 1000
        certificate = Certificate(form, tuple(op for op, _ in through), None)
        for iteration in range(1, self.max_iterations + 1):
            stats = session.run(self.ruleset, max_iterations=1, max_enodes=limit, max_seconds=30.0)
            certificate.steps.append({name: n for name, n in sorted(stats.rule_matches.items()) if n})
            if session.holds(member):
                certificate.reached_at = iteration
                break
            if stats.stop_reason != "iteration budget":  # saturated, or a budget hit: nothing more will come
                break
        return certificate


def _names() -> dict[str, str]:
    """egglog's names of the language's functions: the same in every session (they come from the declarations;
    read from the language's program, no e-graph made for them)."""
    return egg_program.program()[0].names
