"""Search: one pass of the pipeline over a prepared model — facts → rotations → regions → lower → saturate →
extract → raise. Validation (:mod:`egfuse.judge`) decides what stays; a rolled-back region is excluded and the
pass runs again (:func:`egfuse.api.fuse` holds that loop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse import diagnose, functions, protos
from egfuse.cost import CostModel, WithoutForms
from egfuse.enodes import value_index, view
from egfuse.extract import extract
from egfuse.facts import GraphFacts
from egfuse.load import default_opset
from egfuse.lower import Lowerer
from egfuse.prepare import infer_shapes
from egfuse.raise_ import Emitter, replace_output
from egfuse.regions import find_regions
from egfuse.report import RegionReport, Report, RotaryReport
from egfuse.rotary import RotaryWriter, find_rotations
from egfuse.rules import ruleset_for
from egfuse.session import EClass, Session
from egfuse.shapes import class_shapes
from egfuse.targets.spec import FUSED, STANDARD_ATTENTION_OPSET, TargetSpec

RegionKey = int | tuple[str, int]
"""What validation rolls back: an attention region's index, or ("rotary", index)."""


@dataclass
class Budgets:
    """Saturation limits: egglog's ``run`` has none of its own."""

    max_iterations: int = 24
    max_enodes_factor: float = 4.0  # of the e-graph's size after loading
    max_seconds: float = 60.0


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
    target_name = target.name
    model = weights.to_ir(prepared) if weights is not None else ir.serde.deserialize_model(prepared)
    graph = model.graph
    report = Report(source=source, target=target_name, nodes_before=len(prepared.graph.node))

    if functions.concat_sequences(graph) and weights is None:
        model = ir.serde.deserialize_model(infer_shapes(ir.serde.serialize_model(model)))
        graph = model.graph
    facts = GraphFacts(graph)
    for _ in range(8):  # a folded branch may hold Ifs of its own (torchlib's squeeze and gather nest them)
        if not functions.fold_constant_ifs(graph, facts):
            break
        if weights is None:  # the branches' ops had no shapes (an If's output has none): infer them now
            model = ir.serde.deserialize_model(infer_shapes(ir.serde.serialize_model(model)))
            graph = model.graph
        facts = GraphFacts(graph)
    # Rotations first: their outputs become plain values to the attention regions found after them.
    rotated = _fuse_rotations(graph, facts, target, excluded, report, origins)
    regions = find_regions(graph, facts)
    session = Session()
    lowerer = Lowerer(facts, session.names, default_opset(prepared))
    for region in regions:
        lowerer.lower(region)
    session.add(lowerer.table.commands)
    t0 = time.perf_counter()
    start_size = session.size()
    stats = session.run(
        ruleset_for(target.rule_families),
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
    class_of: dict[ir.Value, EClass] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            if value_index(node) is not None:
                class_of[lowerer.table.values[value_index(node)]] = cid
    shapes = class_shapes(classes, lowerer.table, facts)
    cost_model = CostModel(target, shapes)
    choice = extract(classes, cost_model)
    runnable = {op.constructor for op in target.ops}

    any_fused = False
    opsets: set[tuple[str, int]] = set()
    notes: list[str] = []
    no_bias_classes = {cid for cid, nodes in classes.items() if any(n.op == "no_bias" for n in nodes)}
    for region in regions:
        entry = RegionReport(
            region.index,
            region.name,
            "not fused",
            output=region.main_output.name,
            variants=diagnose.variants(region, facts),
            functions=functions.origin([region.softmax, *region.nodes], origins),
        )
        report.regions.append(entry)
        main = class_of.get(region.main_output)
        fused_ops = fused_nodes(main, choice) if main is not None else []
        entry.candidates = diagnose.candidates(main, classes, choice, cost_model) if main is not None else []
        if not fused_ops:
            entry.reason = diagnose.cheaper_unfused(entry.candidates, target_name) or diagnose.why_not(
                region, class_of, classes, runnable, target_name
            )
            continue
        if region.index in excluded:
            reason, diff = excluded[region.index]
            entry.status, entry.reason, entry.max_abs_diff = "rolled back", reason, diff
            continue
        region_choice = choice
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
            lowerer.table,
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
                (out, emitter.value(class_of[out]))
                for out in region.outputs
                if out in class_of and fused_nodes(class_of[out], region_choice)
            ] + emitter.also_replace
        except (ValueError, KeyError) as err:  # nothing was inserted yet: the region stays as it was
            entry.reason = f"the fused form could not be written as ONNX: {err}"
            continue
        anchor = region.nodes[-1]
        graph.insert_before(anchor, emitter.new_nodes)
        for old, new in replacements:
            replace_output(graph, old, new, fresh=new in emitter.created)
        entry.status = "fused"
        written = [target.op_for(op.op) for op in fused_ops]
        entry.fused_into = written[0].label
        opsets.update((op.domain, op.opset) for op in written)
        if emitter.cache_note is not None:
            entry.variants["kv cache"] = emitter.cache_note
        if (
            written[0].mask_note
            and view(fused_ops[0]).bias not in no_bias_classes
            and written[0].mask_note not in notes
        ):
            notes.append(written[0].mask_note)
        any_fused = True

    report.notes.extend(notes)
    if rotated:
        opsets.add(("", STANDARD_ATTENTION_OPSET))
    if any_fused or rotated:
        for domain, version in opsets:
            if model.opset_imports.get(domain, 0) < version:
                model.opset_imports[domain] = version
        ir_passes.RemoveUnusedNodesPass()(model)
        # What each region wrote alike (a mask squeezed or made additive from the same input, constants) is
        # computed once for all layers.
        ir_passes.CommonSubexpressionEliminationPass()(model)
        ir_passes.TopologicalSortPass()(model)
    out = ir.serde.serialize_model(model)
    report.nodes_after = len(out.graph.node)
    return out, report


def _fuse_rotations(
    graph: ir.Graph,
    facts: GraphFacts,
    target: TargetSpec,
    excluded: dict[RegionKey, tuple[str, float]],
    report: Report,
    origins: dict[str, str] | None = None,
) -> bool:
    """Write each proven RoPE as one ``RotaryEmbedding``; the report says what became of each."""
    writer, unavailable, rotated = RotaryWriter(graph, facts), target.no_rotary, False
    for candidate in find_rotations(graph, facts):
        rotation = candidate.rotation
        entry = RotaryReport(candidate.index, candidate.output_name, "not fused", reason=candidate.reason)
        entry.functions = functions.origin([candidate.anchor], origins)
        report.rotary.append(entry)
        if rotation is None:
            continue
        entry.variant = rotation.variant
        if unavailable is not None:
            entry.reason = unavailable
        elif ("rotary", candidate.index) in excluded:
            entry.status = "rolled back"
            entry.reason, entry.max_abs_diff = excluded["rotary", candidate.index]
        else:
            writer.write(rotation, at=candidate.anchor)
            entry.status, entry.fused_into = "fused", "RotaryEmbedding"
            rotated = True
    return rotated


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
