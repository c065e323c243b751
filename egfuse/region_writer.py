"""Writing the extraction back: each region's chosen program is raised into the graph over the region's own
nodes (or the region is left as written, with the reason), and what was written goes into the report.

One :class:`RegionWriter` holds what every region's writing reads — the e-graph read back, the extraction, the
costs, the repeats' renamings — so that the search (:mod:`egfuse.search`) is a short sequence of stages.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import onnx_ir as ir

from egfuse import candidates, diagnose, functions
from egfuse.certify import Certifier
from egfuse.cost import CostModel, WithoutForms
from egfuse.enodes import view
from egfuse.extract import Choice, extract
from egfuse.facts import GraphFacts
from egfuse.lower import Lowered
from egfuse.node_builder import replace_output
from egfuse.raise_ import Emitter
from egfuse.regions import Region
from egfuse.repeats import InPlace, Renamed, Repeats
from egfuse.report import WRITTEN_NOTE, RegionReport, Report, Status
from egfuse.session import EClass, ENode
from egfuse.shapes import Shape
from egfuse.targets.spec import FUSED, FusedOp, TargetSpec

__all__ = ["RegionWriter", "fused_nodes"]


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
    shapes: dict[EClass, Shape]
    cost_model: CostModel
    choice: dict[EClass, Choice]
    repeats: Repeats
    class_of: dict[ir.Value, EClass]
    certifier: Certifier
    alone: dict[int, str]
    """Each attention region's commands lowered alone: its certificate is saturated from them."""
    excluded: dict
    banned: dict[int, dict[str, str]]
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

    def _emitter(self, region, choice: dict[EClass, Choice], prefix: str) -> Emitter:
        return Emitter(self.graph, self.facts, self._table_of(region), self.classes, self.rank_of, choice,
                       self.target, f"egfuse/{prefix}{region.index}", self.shapes, self.opset)  # fmt: skip

    # --- attention regions ---------------------------------------------------------------------------------
    def write_attention(self, region: Region, report: Report) -> bool:
        """The region's chosen fused form written over it, or the region kept with the reason; True if fused."""
        entry = RegionReport(
            region.index,
            region.name,
            Status.NOT_FUSED,
            output=region.main_output.name,
            variants=diagnose.variants(region, self.facts),
            functions=functions.origin([region.softmax, *region.nodes], self.origins),
        )
        report.regions.append(entry)
        region_classes = self.repeats.classes_of(region, self.class_of)
        main = region_classes.get(region.main_output)
        chosen = self._chosen(region, entry, main, region_classes)
        if chosen is None:
            return False
        region_choice, fused_ops = chosen
        entry.form = fused_ops[0].op
        emitter = self._emitter(region, region_choice, "r")
        # Only outputs whose program goes through the fused op are rewritten; the rest (a mask shared with
        # the next layer, a projection used elsewhere) keep their original nodes.
        try:
            replacements = [
                (out, emitter.value(region_classes[out]))
                for out in region.outputs
                if out in region_classes and fused_nodes(region_classes[out], region_choice)
            ] + emitter.also_replace
        except (ValueError, KeyError) as err:  # nothing was inserted yet: the region stays as it was
            entry.reason = f"the fused form could not be written as ONNX: {err}"
            return False
        self.graph.insert_before(region.nodes[-1], emitter.new_nodes)
        for old, new in replacements:
            replace_output(self.graph, old, new, fresh=new in emitter.created)
        entry.status = Status.FUSED
        self._certify(entry, region, main, fused_ops[0], region_choice)
        self._record(entry, emitter, fused_ops, [self.target.op_for(op.op) for op in fused_ops])
        return True

    def _chosen(
        self, region: Region, entry: RegionReport, main: EClass | None, region_classes: dict
    ) -> tuple[dict[EClass, Choice], list[ENode]] | None:
        """The extraction to write the region from and its fused nodes; None (with the entry's reason) where
        the region stays as written: no fused form chosen, rolled back before, or none left that validated."""
        fused_ops = fused_nodes(main, self.choice) if main is not None else []
        entry.candidates = self.price(main) if main is not None else []
        base_choice = self.choice
        if not fused_ops and main is not None and any(c["form"] in FUSED and c["cost_us"] for c in entry.candidates):
            forced = self._forced(region, entry, main)
            if forced is not None:
                base_choice, fused_ops = forced, fused_nodes(main, forced)
        if not fused_ops:
            entry.reason = candidates.cheaper_unfused(entry.candidates, self.target.name) or diagnose.why_not(
                region, region_classes, self.classes, {op.constructor for op in self.target.ops}, self.target.name
            )
            return None
        if region.index in self.excluded:
            reason, diff = self.excluded[region.index]
            entry.status, entry.reason, entry.max_abs_diff = Status.ROLLED_BACK, reason, diff
            return None
        if not self.banned.get(region.index):
            return base_choice, fused_ops
        # forms that did not validate here: the next cheapest one instead
        region_choice = extract(self.classes, WithoutForms(self.cost_model, set(self.banned[region.index])))
        fused_ops = fused_nodes(main, region_choice)
        entry.notes.extend(f"{form} did not validate ({why})" for form, why in self.banned[region.index].items())
        if not fused_ops:
            entry.status, entry.reason = Status.ROLLED_BACK, "no fused form validated"
            return None
        return region_choice, fused_ops

    def _forced(self, region: Region, entry: RegionReport, main: EClass) -> dict[EClass, Choice] | None:
        """The extraction preferred a rewrite of the region's own ops, but an unfused region is kept as written:
        the cheapest fused program instead, where it beats the region as written."""
        as_written = candidates.written_cost(region, self.facts, self.opset, self.target, self.cost_model.value_types)
        forced = candidates.fused_choice(main, self.classes, self.cost_model) if as_written is not None else {}
        if main not in forced or forced[main].total >= as_written:
            return None
        entry.notes.append(
            f"{WRITTEN_NOTE}: {forced[main].total:.1f} µs predicted against their {as_written:.1f} µs (a "
            "rewrite of them is priced lower, but a region not fused is kept as written)"
        )
        return forced

    def _certify(self, entry: RegionReport, region: Region, main: EClass, form: ENode, choice: dict) -> None:
        start = time.perf_counter()
        through = _path_to_form(main, form, choice)
        entry.certificate = self.certifier.certify(self.alone[region.index], entry.form, through).to_json()
        self.seconds_certify += time.perf_counter() - start

    def _record(self, entry: RegionReport, emitter: Emitter, fused_ops: list[ENode], written: list[FusedOp]) -> None:
        """What the written region tells the report: the op, the cache and fill it read, the mask's note."""
        entry.fused_into = written[0].label
        self.opsets.update((op.domain, op.opset) for op in written)
        if emitter.cache_note is not None:
            entry.variants["kv cache"] = emitter.cache_note
        if emitter.assumed_fills:
            entry.assumed_fill = max(emitter.assumed_fills)  # the one the scores reach first
            entry.notes.append(
                f"the select fill {entry.assumed_fill:g} is written to absorb the scores: the fused op equals the "
                "graph while each row keeps a key scoring above it (checked on validation's feeds)"
            )
        bias_is_none = any(n.op == "no_bias" for n in self.classes.get(view(fused_ops[0]).bias, []))
        if written[0].mask_note and not bias_is_none and written[0].mask_note not in self.notes:
            self.notes.append(written[0].mask_note)

    # --- norms, activations, rotations ---------------------------------------------------------------------
    def write_chosen(self, region, prefix: str) -> FusedOp:
        """A norm's, an activation's or a rotation's extracted op written over its output."""
        main = self.class_of[region.main_output]
        emitter = self._emitter(region, self.choice, prefix)
        emitter.graph_values_only, emitter.taken_over = True, self.taken_over
        new = emitter.emit_chosen(main)
        self.graph.insert_before(region.nodes[-1], emitter.new_nodes)
        for old, value in [(region.main_output, new), *emitter.also_replace]:
            replace_output(self.graph, old, value, fresh=value in emitter.created)
            self.taken_over[old] = value
        written = self.target.op_for(self.choice[main].node.op)
        self.opsets.add((written.domain, written.opset))
        return written


def _path_to_form(cid: EClass, form: ENode, choice: dict) -> tuple[tuple[str, int], ...]:
    """The ops the program extracted for ``cid`` applies to ``form``'s result, outermost first, each with the
    argument position it reads it at (empty where ``cid``'s own node is the form)."""
    path: list[tuple[str, int]] = []
    seen: set[EClass] = set()
    while cid in choice and cid not in seen and choice[cid].node is not form:
        seen.add(cid)
        node = choice[cid].node
        args = list(view(node))  # in the constructor's order: the certifier's pattern takes the same positions
        below = [i for i, arg in enumerate(args) if isinstance(arg, EClass) and _reaches(arg, form, choice)]
        if not below:
            return ()
        path.append((node.op, below[0]))
        cid = args[below[0]]
    return tuple(path)


def _reaches(cid: EClass, form: ENode, choice: dict) -> bool:
    return any(node is form for node in fused_nodes(cid, choice))  # (``cid``'s own node is among them)


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
