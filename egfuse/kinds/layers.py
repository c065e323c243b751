"""The rest of a layer — norms and activations: a region kind found beside attention, lowered into the same
e-graph, written after extraction and judged like attention.

* a **norm** region is the neighbourhood of a ``Sqrt`` (or of a power of −½, the reciprocal root in one op) whose
  input reduces with ``ReduceMean``: back to the input the means read, forward through the division and the
  per-feature scale and shift;
* a **GELU** region is the neighbourhood of an ``Erf``: its scaled input, forward through ``1 +``, the
  products with the input and with ½;
* a **residual norm** region (targets whose norm adds the residual) is a ``LayerNormalization`` op and the
  sum it normalizes, or a norm in primitive ops with its sum.

Regions are found structurally; the rules (:mod:`egfuse.rules.norms`, :mod:`egfuse.rules.gelu`) decide what
each computes, extraction chooses the target's op by cost, and a region whose written op differs from the
original on onnxruntime is put back alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.enodes import view
from egfuse.kinds.activation_walk import activation_forward, single_reader_chain, with_constant
from egfuse.kinds.base import RegionKind
from egfuse.kinds.regions import Found, Region, anchored_regions
from egfuse.kinds.values import MEANS, reciprocal_root
from egfuse.report import RegionReport, Status
from egfuse.targets.spec import LAYER_OPS, RESIDUAL_NORMS, TargetSpec
from egfuse.writing.region_writer import ClassReader, RegionWriter

NORM_VOCABULARY = MEANS | {"Sub", "Pow", "Mul", "Div", "Add", "Sqrt", "Reciprocal", "Cast"}
"""The ops a norm is spelled with."""
_MAX_DEPTH = 8
_NORM_FORWARD = frozenset({"Div", "Reciprocal", "Mul", "Add", "Cast"})
_SPREAD = _NORM_FORWARD | {"Neg", "Sub"}
"""The ops of a norm's forward part spread from a value read twice: −mean · i, β − mean · i."""
_SCALES = ("Mul", "Div")


def find(graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], target: TargetSpec) -> list[Region]:
    """The norm and GELU regions no other kind holds, where ``target`` writes any norm or activation."""
    if not any(target.op_for(c) is not None for c in LAYER_OPS):
        return []
    residual = any(target.op_for(c) is not None for c in RESIDUAL_NORMS)
    return find_layer_regions(graph, facts, claimed, residual_norms=residual)


def find_layer_regions(
    graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], *, residual_norms: bool = False
) -> list[Region]:
    """The norm and GELU regions among the nodes no attention region holds (``claimed``), in graph order; with
    ``residual_norms`` (a target that adds the residual in its norm), each ``LayerNormalization`` of a sum too."""

    def region_at(node: ir.Node, claimed: set[ir.Node]) -> Found | None:
        if node.op_type == "Sqrt" or reciprocal_root(node, facts):
            return _norm(node, facts, claimed, residual_norms)
        if node.op_type == "Erf":
            return _gelu(node, facts, claimed)
        if node.op_type == "LayerNormalization" and residual_norms:
            return _residual_norm(node, facts, claimed)
        return None

    return anchored_regions(graph, claimed, region_at)


def _norm(
    sqrt: ir.Node, facts: GraphFacts, claimed: set[ir.Node], residual: bool = False
) -> tuple[set[ir.Node], ir.Value] | None:
    """A norm spelled in primitive ops around ``sqrt``; with ``residual``, the sum it normalizes too (a residual
    ``Add`` of two computed values, before the widening ``Cast`` of a half-precision model's norm)."""
    back = _backward(sqrt.inputs[0], claimed, facts)
    if not any(n.op_type in MEANS for n in back):
        return None
    own = {v for n in back for v in (*n.inputs, *n.outputs) if v is not None}
    forward = _without_trailing_scales(_norm_forward(sqrt, facts, claimed, own), facts)
    members = back | {sqrt} | set(forward)
    for n in forward:
        for value in n.inputs:
            if value is not None:
                members |= _backward(value, claimed | members, facts)
    members |= _widening_casts(members, claimed)
    main = (forward[-1] if forward else sqrt).outputs[0]
    if len(main.uses()) > 1:  # TensorFlow's batch_normalization: x · i + (β − mean · i), i read twice
        members, main = _spread(members, main, facts, claimed)
    if residual:
        members |= _residual_sums(members, facts, claimed)
    return members, main


def _widening_casts(members: set[ir.Node], claimed: set[ir.Node]) -> set[ir.Node]:
    """The ``Cast`` a norm's normalized input comes from, where nothing outside the norm reads it: a
    half-precision model's norm computed in float32 (``x.float()``) starts there, so that with the narrowing
    cast after it the region is the norm in the model's own type (:mod:`egfuse.rules.precision`). An RMS norm's
    backward walk passes it already (its means read x², not x); a layer norm's means read x itself."""
    return {
        cast
        for value, cast in _producers_outside(members, claimed, "Cast")
        if _normalized_input(value) and not value.is_graph_output() and all(u.node in members for u in value.uses())
    }


def _producers_outside(
    members: set[ir.Node], claimed: set[ir.Node], op_type: str
) -> Iterator[tuple[ir.Value, ir.Node]]:
    """Each value the members read that an ``op_type`` node of the standard domain outside them (and outside every
    region found before) computes, with that node."""
    for node in members:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is None or producer in members or producer in claimed or producer.op_type != op_type:
                continue
            if producer.domain in ("", "ai.onnx"):
                yield value, producer


def _spread(
    members: set[ir.Node], main: ir.Value, facts: GraphFacts, claimed: set[ir.Node]
) -> tuple[set[ir.Node], ir.Value]:
    """The norm's ops after a value read more than once: every reader of the members' values that computes only
    from them, constants and the normalized input, to a fixpoint — kept where they end in one value read
    outside (the norm's output), else ``members`` and ``main`` as they were."""
    normalized = {v for n in members for v in n.inputs if v is not None and v.producer() not in members
                  and _normalized_input(v)}  # fmt: skip
    spread = set(members)
    grown = True
    while grown:
        grown = False
        for reader in {use.node for node in spread for out in node.outputs for use in out.uses()} - spread:
            if reader in claimed or reader.op_type not in _SPREAD or reader.domain not in ("", "ai.onnx"):
                continue
            if all(v is None or v in normalized or v.producer() in spread or facts.const(v) is not None
                   for v in reader.inputs):  # fmt: skip
                spread.add(reader)
                grown = True
    outputs = [
        v for n in spread for v in n.outputs if v.is_graph_output() or any(u.node not in spread for u in v.uses())
    ]
    return (spread, outputs[0]) if len(outputs) == 1 else (members, main)


def _residual_sums(members: set[ir.Node], facts: GraphFacts, claimed: set[ir.Node]) -> set[ir.Node]:
    """The residual sum a norm's members read: an ``Add`` of two computed values outside them."""
    sums = {add for _, add in _producers_outside(members, claimed, "Add")
            if all(v is not None and facts.const(v) is None for v in add.inputs)}  # fmt: skip
    return sums if len(sums) == 1 else set()


def _residual_norm(norm: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> tuple[set[ir.Node], ir.Value] | None:
    """A layer norm op whose input is the sum of two computed values (a residual)."""
    add = norm.inputs[0].producer() if norm.inputs[0] is not None else None
    if add is None or add in claimed or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    if any(v is None or facts.const(v) is not None for v in add.inputs):
        return None
    return {add, norm}, norm.outputs[0]


def _gelu(erf: ir.Node, facts: GraphFacts, claimed: set[ir.Node]) -> tuple[set[ir.Node], ir.Value] | None:
    members = {erf} | with_constant(erf.inputs[0], _SCALES, facts, claimed)
    x = erf.inputs[0]
    for scaling in list(members - {erf}):  # the input's own bias (a projection's), which BiasGelu adds itself
        x = next(v for v in scaling.inputs if v is not None and facts.const(v) is None)
        members |= with_constant(x, ("Add",), facts, claimed)
    forward = activation_forward(erf, x, facts, claimed)
    if not forward:
        return None
    members |= set(forward)
    for n in forward:  # ½ · x multiplied in: a product of the input with a constant
        for value in n.inputs:
            if value is not None:
                members |= with_constant(value, _SCALES, facts, claimed | members)
    return members, forward[-1].outputs[0]


def _backward(start: ir.Value, claimed: set[ir.Node], facts: GraphFacts) -> set[ir.Node]:
    """Producers of ``start`` within the norm vocabulary, stopping at the value the means normalize and at
    residual sums (an ``Add`` of two computed values)."""
    found: set[ir.Node] = set()
    frontier = [(start, 0)]
    while frontier:
        value, depth = frontier.pop()
        node = value.producer()
        if node is None or node in found or node in claimed or depth > _MAX_DEPTH or _normalized_input(value):
            continue
        if node.op_type not in NORM_VOCABULARY or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Add" and not any(facts.const(v) is not None for v in node.inputs if v is not None):
            continue  # a residual sum: the input of the norm, not a step of it
        found.add(node)
        frontier.extend((v, depth + 1) for v in node.inputs if v is not None and facts.const(v) is None)
    return found


def _normalized_input(value: ir.Value) -> bool:
    """A value a mean reads that is not itself a square (the variance's): what the norm normalizes."""
    if not any(use.node.op_type in MEANS for use in value.uses()):
        return False
    producer = value.producer()
    if producer is None:
        return True
    if producer.op_type == "Pow":
        return False
    return not (producer.op_type == "Mul" and producer.inputs[0] is producer.inputs[1])


def _norm_forward(sqrt: ir.Node, facts: GraphFacts, claimed: set[ir.Node], own: set[ir.Value]) -> list[ir.Node]:
    """The single readers after the root among the norm's ops, stopping at a sum with a computed value (a
    residual after the norm) and at a product with one that is neither the norm's own (``own``: the values its
    means read or compute) nor made of stored values: a gate (``norm(x) · γ · silu(z)``, the gated RMS norms of
    Mamba and Qwen3-Next's linear attention) multiplies the norm's output, it is no step of it."""

    def accepts(reader: ir.Node, others: list[ir.Value | None]) -> bool:
        if reader.op_type == "Add":
            return all(v is not None and facts.const(v) is not None for v in others)
        if reader.op_type in _SCALES:
            return all(v is not None and _norms_own(v, own, facts) for v in others)
        return True

    return single_reader_chain(sqrt, claimed, _NORM_FORWARD, accepts)


_OWN_STEPS = frozenset({"Cast", "Identity", "Add", "Sub", "Mul", "Neg", "Reshape", "Unsqueeze", "Transpose"})


def _norms_own(value: ir.Value, own: set[ir.Value], facts: GraphFacts, depth: int = 4) -> bool:
    """Computed, in a few elementwise or layout steps, from the norm's own values and stored ones alone: its
    centred input computed again (Cohere's ``(x − mean)`` twice), a weight as a norm applies it (cast up, Gemma's
    ``1 + w``, reshaped) where it is too large to have been evaluated as a constant. A gate is not."""
    if value in own or facts.const(value) is not None:
        return True
    node = value.producer()
    if node is None:
        return value.const_value is not None
    if node.op_type == "Constant":
        return True
    if depth == 0 or node.op_type not in _OWN_STEPS or node.domain not in ("", "ai.onnx"):
        return False
    return all(v is None or _norms_own(v, own, facts, depth - 1) for v in node.inputs)


def _without_trailing_scales(forward: list[ir.Node], facts: GraphFacts) -> list[ir.Node]:
    """The forward chain without the products (and divisions) by a one-element constant after the normalized
    value: a scalar applied to a norm's output belongs to what reads it (SD3.5 multiplies the normalized Q by
    the attention's scale, which attention's split-scale rules take), and a norm ending in one is no norm op."""
    normalized_at = next((i for i, n in enumerate(forward) if n.op_type in _SCALES
                          and any(v is not None and facts.const(v) is None for v in n.inputs)), None)  # fmt: skip
    if normalized_at is None:
        return forward
    end = len(forward)
    while end > normalized_at + 1 and _scalar_scale(forward[end - 1], facts):
        end -= 1
    return forward[:end]


def _scalar_scale(node: ir.Node, facts: GraphFacts) -> bool:
    """``x · s``, ``s · x`` or ``x / s`` with ``s`` a one-element constant."""
    if node.op_type not in _SCALES or len(node.inputs) != 2:
        return False
    positions = (0, 1) if node.op_type == "Mul" else (1,)
    return any((c := facts.const(node.inputs[i])) is not None and np.size(c) == 1 for i in positions)


def write(region: Region, writer: RegionWriter) -> RegionReport:
    """The region written with its extracted form, or kept with the reason."""
    return write_one_op(region, writer, KIND.name, LAYER_OPS, _why_not)


def write_one_op(
    region: Region,
    writer: RegionWriter,
    kind: str,
    forms: frozenset[str],
    why_not: Callable[[Region, RegionWriter], str],
) -> RegionReport:
    """A region whose whole computation is one fused op of ``forms`` (a norm, an activation): written where
    extraction chose one, else kept with ``why_not``'s reason; rolled back where validation excluded it."""
    entry = RegionReport(region.index, region.name, Status.NOT_FUSED, output=region.main_output.name, kind=kind)
    main = writer.class_of.get(region.main_output)
    chosen = writer.choice[main].node if main is not None and main in writer.choice else None
    if chosen is None or chosen.op not in forms:
        entry.reason = why_not(region, writer)
        return entry
    if (kind, region.index) in writer.excluded:
        reason, diff = writer.excluded[kind, region.index]
        entry.status, entry.reason, entry.max_abs_diff = Status.ROLLED_BACK, reason, diff
        return entry
    try:
        written = writer.write_chosen(region, "n")
    except (ValueError, KeyError) as err:
        entry.reason = f"the fused form could not be written as ONNX: {err}"
        return entry
    entry.status, entry.form, entry.fused_into = Status.FUSED, chosen.op, written.label
    return entry


def _why_not(region: Region, writer: RegionWriter) -> str:
    """The first step of :mod:`egfuse.rules.norms` / :mod:`egfuse.rules.gelu` whose term no e-class of the
    region's values holds: read off the saturated e-graph, in the order the rules build the fused form."""
    g = writer.reader(region)
    reached = set().union(*(g.ops(v) for n in region.nodes for v in n.outputs))
    main = g.ops(region.main_output)
    if main & LAYER_OPS:
        return not_chosen(region, writer, sorted(main & LAYER_OPS))
    anchor = region.anchor
    if anchor.op_type == "Erf":
        if "gelu_cdf" not in reached:
            return "erf's argument is not x / √2 (nor x · 1/√2), or 1 is not added to it: no GELU bracket"
        return "the GELU bracket 1 + erf(x/√2) is not multiplied by x and ½ (in any order)"
    if anchor.op_type == "LayerNormalization":
        return "the norm's input is not a residual sum a skip norm can take (two tensors of the same shape)"
    if not reached & {"normalized", "rms_normalized"}:
        return _root_why_not(g, g.of(anchor.inputs[0]))
    return (
        "normalized, but then scaled or shifted by something other than a per-feature weight γ and β (one stored "
        "value per feature), or the last axis' width is unknown"
    )


def not_chosen(region: Region, writer: RegionWriter, proven: list[str]) -> str:
    """The rules proved a fused form that extraction did not choose: the target writes no op for it, has no
    kernel for the region's element type, or prices the ops as written lower."""
    target, dtype = writer.target, region.main_output.dtype
    kind = np.dtype(dtype.numpy()).name if dtype is not None else None
    ops = [op for op in (target.op_for(c) for c in proven) if op is not None]
    if not ops:
        return f"the rules prove {', '.join(proven)}, but target {target.name!r} writes no op for it"
    if kind is not None and all(kind not in op.dtypes for op in ops):
        labels = ", ".join(sorted({op.label for op in ops}))
        return f"the rules prove {', '.join(proven)}, but target {target.name!r} has no {labels} kernel for {kind}"
    return f"the rules prove {', '.join(proven)}, but target {target.name!r} prices the ops as written lower"


def _root_why_not(g: ClassReader, root) -> str:
    """Why √(·) is not a norm's root: no ε added, the mean not the last axis's, ε not a constant ≥ 0."""
    sums = g.nodes(root, "add")
    if not sums:
        return "the root is not √(mean(·) + ε): no constant ε added to a mean of the last axis"
    scalars = g.writer.fact_tables.get("scalar_of", {})
    for total in sums:
        for mean, eps in ((view(total).a, view(total).b), (view(total).b, view(total).a)):
            if g.nodes(mean, "reduce_mean") and scalars.get(eps) is None:
                return "ε added to the mean is not a constant"
            if g.nodes(mean, "reduce_mean") and scalars[eps] < 0:
                return f"ε added to the mean is negative ({scalars[eps]:g})"
    if not any(g.nodes(view(t).a, "reduce_mean") or g.nodes(view(t).b, "reduce_mean") for t in sums):
        return "the mean under the root is not over the last axis (a ReduceMean of the last axis, kept)"
    return "the division is not (x − mean x) / √(var x + ε) nor x / √(mean x² + ε) over the last axis"


KIND = RegionKind(name="layer", report_list="layer_ops", find=find, write=write)
