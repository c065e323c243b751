"""Search: one pass of the pipeline over a prepared model — facts → rotations → regions → lower → saturate →
extract → raise. Validation (:mod:`egfuse.judge`) decides what stays; a rolled-back region is excluded and the
pass runs again (:func:`egfuse.api.fuse` holds that loop).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse import candidates, diagnose, functions, progress, protos
from egfuse.certify import Certifier
from egfuse.cost import CostModel, WithoutForms
from egfuse.enodes import value_index, view
from egfuse.extract import extract
from egfuse.facts import GraphFacts
from egfuse.layer_regions import find_layer_regions, write_layer_regions
from egfuse.load import default_opset
from egfuse.lower import Lowered, Lowerer
from egfuse.memory import DEFAULT_BUDGET_BYTES
from egfuse.node_builder import replace_output
from egfuse.prepare import infer_shapes
from egfuse.raise_ import Emitter
from egfuse.regions import find_regions
from egfuse.repeats import InPlace, NotRenamed, Renamed, find_repeats
from egfuse.report import WRITTEN_NOTE, RegionReport, Report
from egfuse.rotary import find_rotary_regions, write_rotary_regions
from egfuse.rules import ruleset_for
from egfuse.session import EClass, ENode, Session
from egfuse.shape_reads import rewrite_dead_shape_reads
from egfuse.shapes import class_shapes
from egfuse.targets.spec import FUSED, LAYER_OPS, RESIDUAL_NORMS, TargetSpec
from egfuse.wide_classes import float32_classes

RegionKey = int | tuple[str, int]
"""What validation rolls back: an attention region's index, or ("rotary", index)."""


@dataclass
class Budgets:
    """Limits: saturation's (egglog's ``run`` has none of its own) and the memory validation may hold."""

    max_iterations: int = 24
    max_enodes_factor: float = 4.0  # of the e-graph's size after loading
    max_seconds: float = 60.0
    validation_bytes: int | None = DEFAULT_BUDGET_BYTES
    """Running a model on onnxruntime to validate it may hold at most this much (an upper-bound estimate made
    before it runs, :mod:`egfuse.memory`); over it, nothing is applied and the report says why. None: no limit."""


def fuse_once(
    prepared: onnx.ModelProto,
    target: TargetSpec,
    *,
    budgets: Budgets,
    excluded: dict[RegionKey, tuple[str, float]],
    banned: dict[int, dict[str, str]],
    source: str,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """One search; repeated regions are solved once (:mod:`egfuse.repeats`), unless a repeat's program cannot be
    renamed — then the search runs again with every region in the e-graph, which writes the same model slower."""
    settings = dict(budgets=budgets, excluded=excluded, banned=banned, source=source, weights=weights, origins=origins)
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
    banned: dict[int, dict[str, str]],
    source: str,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None,
) -> tuple[onnx.ModelProto, Report]:
    target_name = target.name
    model = weights.to_ir(prepared) if weights is not None else ir.serde.deserialize_model(prepared)
    graph = model.graph
    report = Report(source=source, target=target_name, nodes_before=len(prepared.graph.node))

    if functions.concat_sequences(graph):
        model = _reinferred(model, weights)
        graph = model.graph
    facts = GraphFacts(graph)
    if functions.fold_literal_arithmetic(graph, facts) + functions.split_sequence_items(graph, facts):
        model = _reinferred(model, weights)  # shape inference reads literals: ranks come back downstream
        graph = model.graph
        facts = GraphFacts(graph)
    for _ in range(8):  # a folded branch may hold Ifs of its own (torchlib's squeeze and gather nest them)
        if not functions.fold_constant_ifs(graph, facts):
            break
        model = _reinferred(model, weights)  # the branches' ops had no shapes (an If's output has none)
        graph = model.graph
        facts = GraphFacts(graph)
    # Rotations first: their outputs are plain values to the attention regions found after them.
    rotations = find_rotary_regions(graph, facts)
    rotation_nodes = {n for r in rotations for n in r.region.nodes}
    regions = find_regions(graph, facts, rotation_nodes)
    layer_regions = []
    if any(target.op_for(c) is not None for c in LAYER_OPS):
        residual = any(target.op_for(c) is not None for c in RESIDUAL_NORMS)
        claimed = {n for r in regions for n in r.nodes} | rotation_nodes
        layer_regions = find_layer_regions(graph, facts, claimed, residual_norms=residual)
    ruleset = ruleset_for(target.rule_families)
    certifier = Certifier(facts, default_opset(prepared), ruleset, budgets.max_iterations)
    kinds = [("attention", r) for r in regions] + [("layer", r) for r in layer_regions]
    repeats = find_repeats(kinds + [("rotary", r.region) for r in rotations], certifier.lower, facts,
                           solve_once=solve_once)  # fmt: skip
    session = Session()
    session.register(ruleset)
    session.egraph.push()  # the terms above the rules: popped once read back, the certificates reuse the rules
    lowerer = Lowerer(facts, session.names, default_opset(prepared))
    for region in repeats.representatives:
        lowerer.lower(region)
    session.add(lowerer.table.commands)
    progress.stage(f"saturating the e-graph of {len(regions)} attention regions")
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
    classes, fact_tables = session.freeze()
    session.egraph.pop()
    certifier.adopt(session)
    class_of: dict[ir.Value, EClass] = {}
    for cid, nodes in classes.items():  # a region's own value (``ref``) over another region's leaf of it
        for node in nodes:
            value = lowerer.table.values[value_index(node)] if value_index(node) is not None else None
            if value is not None and (node.op == "ref" or value not in class_of):
                class_of[value] = cid
    repeats.extend(class_of, [*layer_regions, *(r.region for r in rotations)])
    # Each region was lowered alone before any is rewritten: its certificate is saturated once it is fused.
    alone = {r.index: repeats.lowered[id(r)] for r in regions if r.main_output in repeats.classes_of(r, class_of)}
    # Regions that lower alone to the same commands are one region up to value names (same ops, attributes,
    # constants and shapes): the layers of a model. Their certificate is saturated once.
    report.stats["distinct_regions"] = len(set(alone.values()))
    shapes = class_shapes(classes, lowerer.table, facts)
    float32 = float32_classes(classes, lowerer.table)
    cost_model = CostModel(target, shapes, _float_types(r.main_output for r in regions), float32)
    choice = extract(classes, cost_model)
    runnable = {op.constructor for op in target.ops}

    any_fused = False
    opsets: set[tuple[str, int]] = set()
    seconds_certify = 0.0
    notes: list[str] = []
    no_bias_classes = {cid for cid, nodes in classes.items() if any(n.op == "no_bias" for n in nodes)}
    priced: dict[EClass, list[dict]] = {}

    def price(main: EClass) -> list[dict]:
        """The forms ``main`` held, priced (once per class: every repeat of a region asks for the same one)."""
        if main not in priced:
            priced[main] = candidates.priced_forms(main, classes, choice, cost_model)
        return priced[main]

    @functools.cache
    def in_place() -> InPlace:  # indexed once, by the first repeat written (a model may have none)
        return InPlace(lowerer.table, classes)

    def table_of(region) -> Lowered:
        rename = repeats.rename_of(region)
        if rename is None:
            return lowerer.table
        return Renamed(lowerer.table, rename, in_place().kept(rename))

    for done, region in enumerate(regions):
        progress.stage(f"extracting and writing region {done + 1}/{len(regions)}")
        entry = RegionReport(
            region.index,
            region.name,
            "not fused",
            output=region.main_output.name,
            variants=diagnose.variants(region, facts),
            functions=functions.origin([region.softmax, *region.nodes], origins),
        )
        report.regions.append(entry)
        region_classes = repeats.classes_of(region, class_of)
        main = region_classes.get(region.main_output)
        fused_ops = fused_nodes(main, choice) if main is not None else []
        entry.candidates = price(main) if main is not None else []
        base_choice = choice
        if not fused_ops and main is not None and any(c["form"] in FUSED and c["cost_us"] for c in entry.candidates):
            # The extraction preferred a rewrite of the region's own ops, but an unfused region is kept as written.
            as_written = candidates.written_cost(region, facts, default_opset(prepared), target, cost_model.value_types)
            forced = candidates.fused_choice(main, classes, cost_model) if as_written is not None else {}
            if main in forced and forced[main].total < as_written:
                base_choice, fused_ops = forced, fused_nodes(main, forced)
                entry.notes.append(
                    f"{WRITTEN_NOTE}: {forced[main].total:.1f} µs predicted against their {as_written:.1f} µs (a "
                    "rewrite of them is priced lower, but a region not fused is kept as written)"
                )
        if not fused_ops:
            entry.reason = candidates.cheaper_unfused(entry.candidates, target_name) or diagnose.why_not(
                region, region_classes, classes, runnable, target_name
            )
            continue
        if region.index in excluded:
            reason, diff = excluded[region.index]
            entry.status, entry.reason, entry.max_abs_diff = "rolled back", reason, diff
            continue
        region_choice = base_choice
        if banned.get(region.index):  # forms that did not validate here: the next cheapest one instead
            region_choice = extract(classes, WithoutForms(cost_model, set(banned[region.index])))
            fused_ops = fused_nodes(main, region_choice)
            entry.notes.extend(f"{form} did not validate ({why})" for form, why in banned[region.index].items())
            if not fused_ops:
                entry.status, entry.reason = "rolled back", "no fused form validated"
                continue
        entry.form = fused_ops[0].op
        emitter = Emitter(
            graph,
            facts,
            table_of(region),
            classes,
            fact_tables["rank_of"],
            region_choice,
            target,
            f"egfuse/r{region.index}",
            shapes,
            default_opset(prepared),
        )
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
            continue
        anchor = region.nodes[-1]
        graph.insert_before(anchor, emitter.new_nodes)
        for old, new in replacements:
            replace_output(graph, old, new, fresh=new in emitter.created)
        entry.status = "fused"
        t_certify = time.perf_counter()
        through = _path_to_form(main, fused_ops[0], region_choice)
        entry.certificate = certifier.certify(alone[region.index], entry.form, through).to_json()
        seconds_certify += time.perf_counter() - t_certify
        written = [target.op_for(op.op) for op in fused_ops]
        entry.fused_into = written[0].label
        opsets.update((op.domain, op.opset) for op in written)
        if emitter.cache_note is not None:
            entry.variants["kv cache"] = emitter.cache_note
        if emitter.assumed_fills:
            entry.assumed_fill = max(emitter.assumed_fills)  # the one the scores reach first
            entry.notes.append(
                f"the select fill {entry.assumed_fill:g} is written to absorb the scores: the fused op equals the "
                "graph while each row keeps a key scoring above it (checked on validation's feeds)"
            )
        if (
            written[0].mask_note
            and view(fused_ops[0]).bias not in no_bias_classes
            and written[0].mask_note not in notes
        ):
            notes.append(written[0].mask_note)
        any_fused = True

    taken_over: dict[ir.Value, ir.Value] = {}

    def write_chosen(region, prefix: str):
        """A norm's, an activation's or a rotation's extracted op written over its output."""
        main = class_of[region.main_output]
        emitter = Emitter(graph, facts, table_of(region), classes, fact_tables["rank_of"], choice, target,
                          f"egfuse/{prefix}{region.index}", shapes, default_opset(prepared))  # fmt: skip
        emitter.graph_values_only, emitter.taken_over = True, taken_over
        new = emitter.emit_chosen(main)
        graph.insert_before(region.nodes[-1], emitter.new_nodes)
        for old, value in [(region.main_output, new), *emitter.also_replace]:
            replace_output(graph, old, value, fresh=value in emitter.created)
            taken_over[old] = value
        written = target.op_for(choice[main].node.op)
        opsets.add((written.domain, written.opset))
        return written

    write_layer_regions(layer_regions, class_of, choice, excluded, lambda r: write_chosen(r, "n"), report.layer_ops)
    report.rotary = write_rotary_regions(
        rotations, class_of, classes, choice, excluded, lambda r: write_chosen(r, "rope"), target.no_rotary,
        price,
    )  # fmt: skip
    for entry, rotation in zip(report.rotary, rotations, strict=True):
        entry.functions = functions.origin([rotation.anchor], origins)
    any_fused = any_fused or any(r.status == "fused" for r in [*report.layer_ops, *report.rotary])
    report.notes.extend(notes)
    report.stats["seconds_certify"] = seconds_certify
    if any_fused:
        for domain, version in opsets:
            if model.opset_imports.get(domain, 0) < version:
                model.opset_imports[domain] = version
        report.stats["shape_reads_rewritten"] = rewrite_dead_shape_reads(graph, facts, default_opset(prepared))
        ir_passes.RemoveUnusedNodesPass()(model)
        # What each region wrote alike (a mask squeezed or made additive from the same input, constants) is
        # computed once for all layers.
        ir_passes.CommonSubexpressionEliminationPass()(model)
        ir_passes.TopologicalSortPass()(model)
    out = ir.serde.serialize_model(model)
    report.nodes_after = len(out.graph.node)
    return out, report


def _reinferred(model: ir.Model, weights: protos.DetachedWeights | None) -> ir.Model:
    """``model`` with shapes inferred again; a skeleton's weights stay in their file (serializing refers to
    them, and inference reads only their dims)."""
    proto = infer_shapes(ir.serde.serialize_model(model))
    return weights.to_ir(proto) if weights is not None else ir.serde.deserialize_model(proto)


def _float_types(values) -> frozenset[str]:
    """The floating-point element types (numpy names) of ``values``: what a fused op needs a kernel for."""
    types = (v.dtype for v in values if v.dtype is not None and v.dtype.is_floating_point())
    return frozenset(np.dtype(t.numpy()).name for t in types)


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
