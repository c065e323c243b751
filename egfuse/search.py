"""Search: one pass of the pipeline over a prepared model — facts → rotations → regions → lower → saturate →
extract → raise. Validation (:mod:`egfuse.validation.judge`) decides what stays; a rolled-back region is excluded and
the pass runs again (:mod:`egfuse.fixpoint` holds that loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse import progress
from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.certify import Certifier
from egfuse.egraph.cost import CostModel
from egfuse.egraph.enodes import value_index
from egfuse.egraph.extract import extract
from egfuse.egraph.session import EClass, ENode, Session
from egfuse.egraph.shapes import class_shapes
from egfuse.egraph.wide_classes import float32_classes
from egfuse.files import protos
from egfuse.files.load import default_opset
from egfuse.kinds.regions import Region
from egfuse.kinds.registry import KINDS, finding_order
from egfuse.lowering.lower import Lowered, Lowerer
from egfuse.preparation.if_folding import fold_constant_ifs
from egfuse.preparation.literal_folding import fold_literal_arithmetic
from egfuse.preparation.prepare import functions_at_model_opset
from egfuse.preparation.sequences import concat_sequences, split_sequence_items
from egfuse.preparation.shape_inference import infer_shapes
from egfuse.repeats import NotRenamed, find_repeats
from egfuse.report import RegionKey, Report, Status
from egfuse.rules import ruleset_for
from egfuse.targets.spec import TargetSpec
from egfuse.validation.memory import DEFAULT_BUDGET_BYTES
from egfuse.writing.region_writer import RegionWriter
from egfuse.writing.shape_reads import rewrite_dead_shape_reads


@dataclass
class Budgets:
    """Limits: saturation's (egglog's ``run`` has none of its own) and the memory validation may hold."""

    max_iterations: int = 24
    max_enodes_factor: float = 4.0  # of the e-graph's size after loading
    max_seconds: float = 60.0
    validation_bytes: int | None = DEFAULT_BUDGET_BYTES
    """Running a model on onnxruntime to validate it may hold at most this much (an upper-bound estimate made
    before it runs, :mod:`egfuse.validation.memory`); over it, nothing is applied and the report says why. None: no
    limit."""


def fuse_once(
    prepared: onnx.ModelProto,
    target: TargetSpec,
    *,
    budgets: Budgets,
    excluded: dict[RegionKey, tuple[str, float]],
    banned: dict[RegionKey, dict[str, str]],
    source: str,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None = None,
    on_found: Callable[[list[str]], None] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """One search; repeated regions are solved once (:mod:`egfuse.repeats`), unless a repeat's program cannot be
    renamed — then the search runs again with every region in the e-graph, which writes the same model slower.
    ``on_found`` is told the output names of every region found, before any is lowered: what validation will
    compare, known early enough to start the original's runs beside the search (:mod:`egfuse.validation.ahead`)."""
    settings = dict(budgets=budgets, excluded=excluded, banned=banned, source=source, weights=weights, origins=origins,
                    on_found=on_found)  # fmt: skip
    try:
        return _search(prepared, target, solve_once=True, **settings)
    except NotRenamed:
        return _search(prepared, target, solve_once=False, **settings)


def _search(
    prepared: onnx.ModelProto,
    target: TargetSpec,
    *,
    solve_once: bool,
    budgets: Budgets,
    excluded: dict[RegionKey, tuple[str, float]],
    banned: dict[RegionKey, dict[str, str]],
    source: str,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None,
    on_found: Callable[[list[str]], None] | None,
) -> tuple[onnx.ModelProto, Report]:
    """The stages in order: simplify → find regions → lower and saturate → extract → write each region →
    clean up. Each stage is a function below; the state they share once extraction is done is a
    :class:`~egfuse.writing.region_writer.RegionWriter`."""
    report = Report(source=source, target=target.name, nodes_before=len(prepared.graph.node))
    loaded = weights.to_ir(prepared) if weights is not None else ir.serde.deserialize_model(prepared)
    model, facts = _simplified(loaded, weights)
    found = _Found.of(model.graph, facts, target)
    if on_found is not None:
        on_found([region.main_output.name for _, region in found.kinds() if region.main_output is not None])
    opset = default_opset(prepared)
    rollback = {"excluded": excluded, "banned": banned, "origins": origins}
    writer = _extracted(found, model.graph, facts, target, opset, budgets, report, rollback, solve_once=solve_once)
    for kind in KINDS:
        entries, regions = getattr(report, kind.report_list), found.by_kind[kind.name]
        for done, region in enumerate(regions):
            progress.stage(f"writing {kind.name} region {done + 1}/{len(regions)}")
            entries.append(kind.write(region, writer))
    report.notes.extend(writer.notes)
    report.stats["seconds_certify"] = writer.seconds_certify
    if report.changed:
        _cleaned(model, facts, writer.opsets, report, opset)
    out = ir.serde.serialize_model(model)
    if report.changed and out.functions:
        functions_at_model_opset(out)  # the opset a written standard op raised, for the functions kept too
    report.nodes_after = len(out.graph.node)
    return out, report


def _simplified(model: ir.Model, weights: protos.DetachedWeights | None) -> tuple[ir.Model, GraphFacts]:
    """The graph with what hides its ops from the rules folded (sequences concatenated, literal arithmetic,
    constant Ifs), shapes inferred again after each change, and the facts read from it."""
    if concat_sequences(model.graph):
        model = _reinferred(model, weights)
    facts = GraphFacts(model.graph)
    if fold_literal_arithmetic(model.graph, facts) + split_sequence_items(model.graph, facts):
        model = _reinferred(model, weights)  # shape inference reads literals: ranks come back downstream
        facts = GraphFacts(model.graph)
    for _ in range(8):  # a folded branch may hold Ifs of its own (torchlib's squeeze and gather nest them)
        if not fold_constant_ifs(model.graph, facts):
            break
        model = _reinferred(model, weights)  # the branches' ops had no shapes (an If's output has none)
        facts = GraphFacts(model.graph)
    return model, facts


@dataclass
class _Found:
    """The regions of each kind (:mod:`egfuse.kinds`), in the registry's order."""

    by_kind: dict[str, list[Region]]

    @classmethod
    def of(cls, graph: ir.Graph, facts: GraphFacts, target: TargetSpec) -> _Found:
        """Each kind's regions, found in turn: a node one kind holds stays out of the regions found after it."""
        claimed: set[ir.Node] = set()
        found: dict[str, list[Region]] = {}
        for kind in finding_order():
            found[kind.name] = kind.find(graph, facts, claimed, target)
            claimed |= {node for region in found[kind.name] for node in region.nodes}
        return cls({kind.name: found[kind.name] for kind in KINDS})

    @property
    def attention(self) -> list[Region]:
        return self.by_kind["attention"]

    def kinds(self) -> list[tuple[str, Region]]:
        return [(name, region) for name, regions in self.by_kind.items() for region in regions]


def _extracted(
    found: _Found,
    graph: ir.Graph,
    facts: GraphFacts,
    target: TargetSpec,
    opset: int,
    budgets: Budgets,
    report: Report,
    rollback: dict,
    *,
    solve_once: bool,
) -> RegionWriter:
    """Every distinct region lowered into one e-graph, saturated, read back and extracted under the target's
    costs: the state writing needs (``rollback``: the regions excluded, the forms banned, the functions the
    nodes came from)."""
    ruleset = ruleset_for(target.rule_families)
    certifier = Certifier(facts, opset, ruleset, budgets.max_iterations)
    repeats = find_repeats(found.kinds(), certifier.lower, facts, solve_once=solve_once)
    session = Session()
    lowerer = Lowerer(facts, session.names, opset)
    for region in repeats.representatives:
        lowerer.lower(region)
    # Only the rules that can fire on these terms, or on any region's alone (its certificate's e-graph).
    # Equal lowerings (the layers) call the same constructors: each distinct one is read once.
    alone = (c for lowered in set(repeats.lowered.values()) for c in lowered.commands)
    session.register(ruleset, session.constructors_in([*lowerer.table.commands, *alone]))
    report.stats["rules_loaded"] = session.rules_loaded
    session.egraph.push()  # the terms above the rules: popped once read back, the certificates reuse the rules
    session.add(lowerer.table.commands)
    _saturate(session, ruleset, budgets, report, len(found.attention))
    classes, fact_tables = session.freeze()
    session.egraph.pop()
    certifier.adopt(session)
    class_of = _classes_of_values(classes, lowerer.table)
    repeats.extend(class_of, [region for name, region in found.kinds() if name != "attention"])
    # Each region was lowered alone before any is rewritten: its certificate is saturated once it is fused.
    regions = found.attention
    alone = {r.index: repeats.lowered[id(r)] for r in regions if r.main_output in repeats.classes_of(r, class_of)}
    # Regions that lower alone to the same commands are one region up to value names (same ops, attributes,
    # constants and shapes): the layers of a model. Their certificate is saturated once.
    report.stats["distinct_regions"] = len(set(alone.values()))
    shapes = class_shapes(classes, lowerer.table, facts)
    float32 = float32_classes(classes, lowerer.table)
    cost_model = CostModel(target, shapes, _float_types(r.main_output for r in regions), float32)
    choice = extract(classes, cost_model)
    return RegionWriter(
        graph=graph, facts=facts, target=target, opset=opset, table=lowerer.table, classes=classes,
        rank_of=fact_tables["rank_of"], fact_tables=fact_tables, shapes=shapes, cost_model=cost_model, choice=choice,
        repeats=repeats, class_of=class_of, certifier=certifier, alone=alone, **rollback,
    )  # fmt: skip


def _saturate(session: Session, ruleset, budgets: Budgets, report: Report, regions: int) -> None:
    """The rules run to saturation or a budget; what happened goes into the report's stats."""
    progress.stage(f"saturating the e-graph of {regions} attention regions")
    t0 = time.perf_counter()
    start_size = session.size()
    stats = session.run(
        ruleset,
        max_iterations=budgets.max_iterations,
        max_enodes=int(start_size * budgets.max_enodes_factor) + 1000,
        max_seconds=budgets.max_seconds,
    )
    report.stats.update(
        seconds_saturate=time.perf_counter() - t0,
        enodes_before=stats.enodes_before,
        enodes_after=stats.enodes_after,
        iterations=stats.iterations,
        stop_reason=stats.stop_reason,
    )
    report.rules = dict(sorted(stats.rule_matches.items(), key=lambda item: (-item[1], item[0])))


def _classes_of_values(classes: dict[EClass, list[ENode]], table: Lowered) -> dict[ir.Value, EClass]:
    """Each graph value's e-class: a region's own value (``ref``) over another region's leaf of it."""
    class_of: dict[ir.Value, EClass] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            value = table.values[value_index(node)] if value_index(node) is not None else None
            if value is not None and (node.op == "ref" or value not in class_of):
                class_of[value] = cid
    return class_of


def _cleaned(model: ir.Model, facts: GraphFacts, opsets: set[tuple[str, int]], report: Report, opset: int) -> None:
    """After writing: the opset imports the written ops need, dead shape reads rewritten, the replaced nodes
    removed, and what each region wrote alike (a mask squeezed or made additive from the same input,
    constants) computed once for all layers."""
    for domain, version in opsets:
        if model.opset_imports.get(domain, 0) < version:
            model.opset_imports[domain] = version
    report.stats["shape_reads_rewritten"] = rewrite_dead_shape_reads(model.graph, facts, opset)
    ir_passes.RemoveUnusedNodesPass()(model)
    named = _fused_outputs(model.graph, report)
    ir_passes.CommonSubexpressionEliminationPass()(model)
    _keep_names(model.graph, named)
    ir_passes.TopologicalSortPass()(model)


def _fused_outputs(graph: ir.Graph, report: Report) -> dict[ir.Value, tuple[str, list[ir.Usage]]]:
    """The values fused regions' outputs are named by (what validation asks for by name): name and uses."""
    wanted = {entry.output for entry in report.entries() if entry.status == Status.FUSED and entry.output}
    return {value: (value.name, list(value.uses())) for node in graph for value in node.outputs
            if value.name in wanted}  # fmt: skip


def _keep_names(graph: ir.Graph, named: dict[ir.Value, tuple[str, list[ir.Usage]]]) -> None:
    """A fused region's output that common-subexpression elimination merged into another's (two norms of one
    input with equal weights: GPT-NeoX's parallel residual at random init, where the exporter stores one copy of
    the equal weights) is named again, by an Identity of the value its readers read now — or of itself, where
    the merge gave it a graph output's name: validation compares every fused region by its output's name, and
    a name gone made the whole fused model "fail to run"."""
    for value, (name, uses) in named.items():
        producer = value.producer()
        if producer is not None and producer.graph is graph:
            survivor = value  # kept, but maybe renamed after a graph output it now stands for
        else:
            survivor = next((use.node.inputs[use.idx] for use in uses if use.node.graph is graph), None)
        if survivor is None or survivor.name == name:
            continue
        kept = ir.Value(name=name, type=survivor.type, shape=survivor.shape)
        graph.append(ir.node("Identity", [survivor], outputs=[kept]))


def _reinferred(model: ir.Model, weights: protos.DetachedWeights | None) -> ir.Model:
    """``model`` with shapes inferred again; a skeleton's weights stay in their file (serializing refers to
    them, and inference reads only their dims)."""
    proto = infer_shapes(ir.serde.serialize_model(model))
    return weights.to_ir(proto) if weights is not None else ir.serde.deserialize_model(proto)


def _float_types(values) -> frozenset[str]:
    """The floating-point element types (numpy names) of ``values``: what a fused op needs a kernel for."""
    types = (v.dtype for v in values if v.dtype is not None and v.dtype.is_floating_point())
    return frozenset(np.dtype(t.numpy()).name for t in types)
