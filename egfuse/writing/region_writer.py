"""Writing the extraction back: the state every region kind's writer reads (:mod:`egfuse.kinds`).

One :class:`RegionWriter` holds what writing any region needs — the e-graph read back, the extraction, the
costs, the repeats' renamings, what was rolled back — so that the search (:mod:`egfuse.search`) is a short
sequence of stages and each kind's module only says how its regions are written.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph import candidates
from egfuse.egraph.certify import Certifier, LoweredRegion
from egfuse.egraph.cost import CostModel
from egfuse.egraph.extract import Choice
from egfuse.egraph.session import EClass, ENode
from egfuse.egraph.shapes import Shape
from egfuse.lowering.lower import Lowered
from egfuse.repeats import InPlace, Renamed, Repeats
from egfuse.targets.spec import FUSED, FusedOp, TargetSpec
from egfuse.writing.node_builder import replace_output
from egfuse.writing.raise_ import Emitter

__all__ = ["ClassReader", "RegionWriter", "fused_nodes"]


@dataclass
class RegionWriter:
    """The search's state once the e-graph is read back and extracted: what writing any region needs."""

    graph: ir.Graph
    facts: GraphFacts
    target: TargetSpec
    opset: int
    table: Lowered
    classes: dict[EClass, list[ENode]]
    rank_of: dict
    fact_tables: dict[str, dict[EClass, object]]
    """The facts the rules proved, by name (``halves_repeat``, ``last_dim`` …): what a miss is explained from."""
    shapes: dict[EClass, Shape]
    cost_model: CostModel
    choice: dict[EClass, Choice]
    repeats: Repeats
    class_of: dict[ir.Value, EClass]
    certifier: Certifier
    alone: dict[int, LoweredRegion]
    """Each attention region's commands lowered alone: its certificate is saturated from them."""
    excluded: dict[tuple[str, int], tuple[str, float]]
    """What validation rolled back, by (kind, index), with the reason and the difference it measured."""
    banned: dict[tuple[str, int], dict[str, str]]
    """Forms that did not validate for a region, with why: the next cheapest one is written instead."""
    origins: dict[str, str] | None
    notes: list[str] = field(default_factory=list)
    """Notes for the whole report (a fused op's mask behaviour), each once."""
    opsets: set[tuple[str, int]] = field(default_factory=set)
    """(domain, version) of every op written: the model's imports are raised to them."""
    seconds_certify: float = 0.0
    taken_over: dict[ir.Value, ir.Value] = field(default_factory=dict)
    _priced: dict[EClass, list[dict]] = field(default_factory=dict)

    def price(self, main: EClass) -> list[dict]:
        """The forms ``main`` held, priced (once per class: every repeat of a region asks for the same one)."""
        if main not in self._priced:
            self._priced[main] = candidates.priced_forms(main, self.classes, self.choice, self.cost_model)
        return self._priced[main]

    @functools.cached_property
    def _in_place(self) -> InPlace:  # indexed once, by the first repeat written (a model may have none)
        return InPlace(self.table, self.classes)

    def _table_of(self, region) -> Lowered:
        rename = self.repeats.rename_of(region)
        if rename is None:
            return self.table
        return Renamed(self.table, rename, self._in_place.kept(rename))

    def emitter(self, region, choice: dict[EClass, Choice], prefix: str) -> Emitter:
        """An emitter writing ``region`` (a repeat with its own values) from ``choice``; its new nodes are named
        ``egfuse/<prefix><index>``."""
        return Emitter(self.graph, self.facts, self._table_of(region), self.classes, self.rank_of, choice,
                       self.target, f"egfuse/{prefix}{region.index}", self.shapes, self.opset)  # fmt: skip

    def reader(self, region) -> ClassReader:
        """The saturated e-graph as ``region`` sees it (a repeat's values in its representative's classes): what
        a kind reads to explain why a region stays as written."""
        return ClassReader(self, self.repeats.classes_of(region, self.class_of))

    def write_chosen(self, region, prefix: str) -> FusedOp:
        """A norm's, an activation's or a rotation's extracted op written over its output."""
        main = self.class_of[region.main_output]
        emitter = self.emitter(region, self.choice, prefix)
        emitter.graph_values_only, emitter.taken_over = True, self.taken_over
        new = emitter.emit_chosen(main)
        self.graph.insert_before(region.nodes[-1], emitter.new_nodes)
        for old, value in [(region.main_output, new), *emitter.also_replace]:
            replace_output(self.graph, old, value, fresh=value in emitter.created)
            self.taken_over[old] = value
        written = self.target.op_for(self.choice[main].node.op)
        self.opsets.add((written.domain, written.opset))
        return written


class ClassReader:
    """E-nodes of a value's class and facts of a class, read off the saturated e-graph by a region's values."""

    def __init__(self, writer: RegionWriter, class_of: Mapping[ir.Value, EClass]) -> None:
        self.writer, self.class_of = writer, class_of

    def of(self, value: ir.Value | None) -> EClass | None:
        return self.class_of.get(value) if value is not None else None

    def nodes(self, cid: EClass | None, op: str | None = None) -> list[ENode]:
        found = self.writer.classes.get(cid, []) if cid is not None else []
        return [n for n in found if op is None or n.op == op]

    def ops(self, value: ir.Value | None) -> set[str]:
        """The constructors ``value``'s class holds (empty where the value has no class)."""
        return {n.op for n in self.nodes(self.of(value))}

    def fact(self, name: str, cid: EClass | None):
        return self.writer.fact_tables.get(name, {}).get(cid) if cid is not None else None


def fused_nodes(cid: EClass, choice: dict) -> list:
    """The fused e-nodes in the program extracted for ``cid`` (empty: the region stays as it was)."""
    found, seen, stack = [], set(), [cid]
    while stack:
        c = stack.pop()
        if c in seen or c not in choice:
            continue
        seen.add(c)
        node = choice[c].node
        if node.op in FUSED:
            found.append(node)
        stack.extend(node.children)
    return found
