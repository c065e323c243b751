"""Attention: the neighbourhood of each last-axis Softmax (:mod:`egfuse.kinds.regions`), written as the fused attention
op extraction chose for it, with its certificate, or kept as written with the first algebra step it did not reach
(:mod:`egfuse.kinds.diagnose`).
"""

from __future__ import annotations

import time
from dataclasses import replace

import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph import candidates
from egfuse.egraph.cost import WithoutForms
from egfuse.egraph.enodes import view
from egfuse.egraph.extract import Choice, extract
from egfuse.egraph.session import EClass, ENode
from egfuse.kinds import diagnose
from egfuse.kinds.base import RegionKind
from egfuse.kinds.regions import Region, find_regions
from egfuse.preparation import functions
from egfuse.report import WRITTEN_NOTE, RegionReport, Status
from egfuse.targets.spec import FUSED, FusedOp, TargetSpec
from egfuse.writing.node_builder import replace_output
from egfuse.writing.raise_ import Emitter
from egfuse.writing.region_writer import RegionWriter, fused_nodes


def find(graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], target: TargetSpec) -> list[Region]:
    """One region per Softmax (attention written head by head joined into one)."""
    return find_regions(graph, facts, claimed)


def write(region: Region, writer: RegionWriter) -> RegionReport:
    """The region's chosen fused form written over it, or the region kept with the reason."""
    entry = RegionReport(
        region.index,
        region.name,
        Status.NOT_FUSED,
        output=region.main_output.name,
        variants=diagnose.variants(region, writer.facts),
        functions=functions.origin([region.anchor, *region.nodes], writer.origins),
    )
    region_classes = writer.repeats.classes_of(region, writer.class_of)
    output, passed = _fused_output(region, writer, region_classes)
    if output is not region.main_output:
        entry.output = output.name
        entry.notes.append(f"written at {output.name!r}: {_TAIL_NOTE}")
    main = region_classes.get(output)
    chosen = _chosen(region, writer, entry, main, region_classes)
    if chosen is None:
        return entry
    region_choice, fused_ops = chosen
    entry.form = fused_ops[0].op
    emitter = writer.emitter(region, region_choice, "r")
    # Only outputs whose program goes through the fused op are rewritten; the rest (a mask shared with
    # the next layer, a projection used elsewhere) keep their original nodes.
    # Written on the layout tail: the tail's own values stay the graph's (they read the op's output).
    outputs = [out for out in region.outputs if out not in passed]
    outputs += [] if output in outputs else [output]
    try:
        replacements = [
            (out, emitter.value(region_classes[out]))
            for out in outputs
            if out in region_classes and fused_nodes(region_classes[out], region_choice)
        ] + emitter.also_replace
    except (ValueError, KeyError) as err:  # nothing was inserted yet: the region stays as it was
        entry.reason = f"the fused form could not be written as ONNX: {err}"
        return entry
    writer.graph.insert_before(_first_reader(region, output), emitter.new_nodes)
    for old, new in replacements:
        replace_output(writer.graph, old, new, fresh=new in emitter.created)
        writer.taken_over[old] = new  # a norm or activation reading the output (BitNet's sub-norm) reads the op's
    entry.status = Status.FUSED
    _certify(writer, entry, region, output, main, fused_ops[0], region_choice)
    _record(writer, entry, emitter, fused_ops, [writer.target.op_for(op.op) for op in fused_ops])
    return entry


_TAIL_LAYOUT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity"})
_TAIL_NOTE = (
    "the layout ops after it (a head split the rules do not read back into the op's output, such as "
    "windowed attention's (B·N, S, H) → (B, N, h, w, H) view) stay as the graph wrote them, reading the fused op"
)


def _fused_output(region: Region, writer: RegionWriter, region_classes) -> tuple[ir.Value, set[ir.Value]]:
    """The value the fused op is written at, and the tail's values after it: the region's main output (none
    after it), or — where its class holds no fused form — the nearest value before it on the region's layout
    tail (attention · V, then only views and transposes) whose class does. A reshape of the heads no rule reads
    then keeps the graph's own nodes after the op instead of keeping the whole region as written (the algebra
    stops at the op's output; nothing after it changes meaning)."""
    main = region.main_output
    members = set(region.nodes)
    value, node, passed = main, main.producer(), set()
    while not _has_fused_form(writer, region_classes.get(value)):
        if node is None or node not in members or node.op_type not in _TAIL_LAYOUT or not node.inputs:
            return main, set()
        passed.add(value)
        value = node.inputs[0]
        if value is None:
            return main, set()
        node = value.producer()
    return value, passed


def _has_fused_form(writer: RegionWriter, cid: EClass | None) -> bool:
    return cid is not None and any(c["form"] in FUSED and c["cost_us"] for c in writer.price(cid))


def _first_reader(region: Region, output: ir.Value) -> ir.Node:
    """Where the fused nodes go: before the region's last node, or — written at a value on the layout tail —
    before the first region node reading it (the tail's nodes after it read the op's output)."""
    if output is region.main_output:
        return region.nodes[-1]
    readers = {use.node for use in output.uses()}
    return next((node for node in region.nodes if node in readers), region.nodes[-1])


def _chosen(
    region: Region, writer: RegionWriter, entry: RegionReport, main: EClass | None, region_classes: dict
) -> tuple[dict[EClass, Choice], list[ENode]] | None:
    """The extraction to write the region from and its fused nodes; None (with the entry's reason) where
    the region stays as written: no fused form chosen, rolled back before, or none left that validated."""
    fused_ops = fused_nodes(main, writer.choice) if main is not None else []
    entry.candidates = writer.price(main) if main is not None else []
    base_choice = writer.choice
    if not fused_ops and main is not None and any(c["form"] in FUSED and c["cost_us"] for c in entry.candidates):
        forced = _forced(region, writer, entry, main)
        if forced is not None:
            base_choice, fused_ops = forced, fused_nodes(main, forced)
    if not fused_ops:
        entry.reason = _explain(region, writer, entry, region_classes)
        return None
    key = (KIND.name, region.index)
    if key in writer.excluded:
        reason, diff = writer.excluded[key]
        entry.status, entry.reason, entry.max_abs_diff = Status.ROLLED_BACK, reason, diff
        return None
    if not writer.banned.get(key):
        return base_choice, fused_ops
    # forms that did not validate here: the next cheapest one instead
    region_choice = extract(writer.classes, WithoutForms(writer.cost_model, set(writer.banned[key])))
    fused_ops = fused_nodes(main, region_choice)
    entry.notes.extend(f"{form} did not validate ({why})" for form, why in writer.banned[key].items())
    if not fused_ops:
        entry.status, entry.reason = Status.ROLLED_BACK, "no fused form validated"
        return None
    return region_choice, fused_ops


def _explain(region: Region, writer: RegionWriter, entry: RegionReport, region_classes: dict) -> str:
    """Why no fused form was chosen: the region's own ops predicted cheaper, or the first algebra step the
    rules did not reach."""
    target = writer.target
    return candidates.cheaper_unfused(entry.candidates, target.name) or diagnose.why_not(
        region, region_classes, writer.classes, {op.constructor for op in target.ops}, target.name
    )


def _forced(region: Region, writer: RegionWriter, entry: RegionReport, main: EClass) -> dict[EClass, Choice] | None:
    """The extraction preferred a rewrite of the region's own ops, but an unfused region is kept as written:
    the cheapest fused program instead, where it beats the region as written."""
    as_written = candidates.written_cost(
        region, writer.facts, writer.opset, writer.target, writer.cost_model.value_types
    )
    forced = candidates.fused_choice(main, writer.classes, writer.cost_model) if as_written is not None else {}
    if main not in forced or forced[main].total >= as_written:
        return None
    entry.notes.append(
        f"{WRITTEN_NOTE}: {forced[main].total:.1f} µs predicted against their {as_written:.1f} µs (a "
        "rewrite of them is priced lower, but a region not fused is kept as written)"
    )
    return forced


def _certify(
    writer: RegionWriter,
    entry: RegionReport,
    region: Region,
    output: ir.Value,
    main: EClass,
    form: ENode,
    choice: dict,
) -> None:
    start = time.perf_counter()
    through = _path_to_form(main, form, choice)
    alone = writer.alone[region.index]
    if output is not region.main_output and output in alone.values:  # written on the layout tail: that class
        alone = replace(alone, output=alone.values.index(output))
    entry.certificate = writer.certifier.certify(alone, entry.form, through).to_json()
    writer.seconds_certify += time.perf_counter() - start


def _record(
    writer: RegionWriter, entry: RegionReport, emitter: Emitter, fused_ops: list[ENode], written: list[FusedOp]
) -> None:
    """What the written region tells the report: the op, the cache and fill it read, the mask's note."""
    entry.fused_into = written[0].label
    writer.opsets.update((op.domain, op.opset) for op in written)
    if emitter.cache_note is not None:
        entry.variants["kv cache"] = emitter.cache_note
    if emitter.assumed_fills:
        entry.assumed_fill = max(emitter.assumed_fills)  # the one the scores reach first
        entry.notes.append(
            f"the select fill {entry.assumed_fill:g} is written to absorb the scores: the fused op equals the "
            "graph while each row keeps a key scoring above it (checked on validation's feeds)"
        )
    bias_is_none = any(n.op == "no_bias" for n in writer.classes.get(view(fused_ops[0]).bias, []))
    if written[0].mask_note and not bias_is_none and written[0].mask_note not in writer.notes:
        writer.notes.append(written[0].mask_note)


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


KIND = RegionKind(name="attention", report_list="regions", find=find, write=write)
