"""Rotary position embeddings (RoPE): the regions a rotation spans, lowered into the e-graph like attention.

Exporters spell RoPE as ``x·cos + rotate(x)·sin`` on the first R of H features of each head (R = H, or
partial: the rest concatenated back unchanged), rotate-half (Llama) or interleaved (GPT-J). A region is found
from the rotation's one unmistakable node, the ``Concat`` that puts ``Neg`` in front, and holds the rotate, the
products, the sum, a partial rotation's ends and the ops its cos/sin tables are computed with. What it
computes is decided by the rules (:mod:`egfuse.rules.rotary`: the tables are proven to repeat what the op
reads), extraction chooses ``RotaryEmbedding`` by cost where the target writes it, and
:mod:`egfuse.writing.rotary_write` writes it. A region the rules prove nothing of keeps its ops; the report says which
step of the rules it did not reach (:mod:`egfuse.kinds.rotary_why`). A rotation's output is an ordinary value to
the attention regions, so a rotation that is not fused never blocks attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.kinds.base import RegionKind
from egfuse.kinds.regions import Region, _with_outputs, reads_type_only, single_consumer
from egfuse.kinds.rotary_why import RotationValues, variant, why_not
from egfuse.preparation import functions
from egfuse.report import RotaryReport, Status
from egfuse.targets.spec import ROTARY_OPS, TargetSpec
from egfuse.writing.region_writer import ClassReader, RegionWriter


@dataclass(eq=False)
class RotaryRegion(Region):
    """A rotation's nodes, found from its anchor (the node whose output is rotate(x)): lowered into the e-graph,
    where the rules decide what it is."""

    spelling: str = "rotate-half"
    """How the rotate pairs x's features: "interleaved"; "split-halves" (x's halves rotated apart, no rotate written);
    "strided-halves" (x's even and odd features rotated apart and joined as halves)."""
    values: RotationValues | None = None  # what each step of the rotation computes, for the explanation


_TABLE_OPS = frozenset({"Unsqueeze", "Cos", "Sin", "Cast", "Concat", "Gather", "Mul", "Div", "Identity", "Neg", "Slice",
                        "GatherND", "Transpose", "Split",  # (a sinusoidal table split into its sin and cos: RoFormer)
                        "Expand", "Tile", "Reshape"})  # fmt: skip
"""Ops a cos/sin table is computed with, after its angles: walked back from the products that read it."""
_MAX_TABLE_DEPTH = 8


def find(graph: ir.Graph, facts: GraphFacts, claimed: set[ir.Node], target: TargetSpec) -> list[Region]:
    """Every rotation (found before the other kinds: nothing is claimed yet)."""
    return find_rotary_regions(graph, facts)


def find_rotary_regions(graph: ir.Graph, facts: GraphFacts) -> list[RotaryRegion]:
    """Each rotation's neighbourhood, from the ``Concat`` that puts ``Neg`` in front: the rotate, the products
    and the sum (and a partial rotation's slice and concatenation back), and the table ops that feed the
    products. Tables are shared: each region holds their ops, so each proves its own."""
    order = {node: i for i, node in enumerate(graph)}
    found: list[RotaryRegion] = []
    for node in graph:
        spelling = _spelling(node)
        if spelling is None:
            continue
        if spelling == "split-halves":
            found.append(_halves_region(node, len(found), order, facts))
            continue
        anchor, members = node, _rotate_nodes(node)
        if spelling == "interleaved":  # the stacked pairs are flattened by the Reshape that reads them
            users = [use.node for use in node.outputs[0].uses() if use.node.op_type != "Shape"]
            anchor = users[0] if len(users) == 1 and users[0].op_type == "Reshape" else node
            members.add(anchor)
        values, around = _around(anchor, members, facts)
        members |= around
        nodes = sorted(members, key=order.__getitem__)
        region = RotaryRegion(index=len(found), anchor=anchor, nodes=nodes, spelling=spelling, values=values)
        found.append(_with_outputs(region, values.output))
    return found


def _halves_region(concat: ir.Node, index: int, order: dict[ir.Node, int], facts: GraphFacts) -> RotaryRegion:
    """A rotation written on x's halves apart (gpt-oss: ``[x₁·c − x₂·s, x₂·c + x₁·s]``): the halves, the four
    products, the difference, the sum and their join, the tables' ops, and a partial rotation's ends."""
    sub, add = (v.producer() for v in concat.inputs)
    products = [m for n in (sub, add) for m in (v.producer() for v in n.inputs) if m is not None]
    halves = {v.producer() for m in products for v in m.inputs if v is not None and _is_half(v)}
    members = {concat, sub, add, *products, *halves}
    halves_of = {n.outputs[0] for n in halves}
    for product in products:
        for value in product.inputs:
            if value is not None and value not in halves_of:
                members |= _table_nodes(value)
    output = concat.outputs[0]
    source = next(iter(halves)).inputs[0].producer()
    putback = _putback(output, source, facts)
    if putback is not None:
        members |= {source, putback} | {v.producer() for v in putback.inputs if v is not None}
        output = putback.outputs[0]
    members.discard(None)
    values = RotationValues(concat.outputs[0], None, None, concat.outputs[0], output)
    nodes = sorted(members, key=order.__getitem__)
    spelling = "strided-halves" if any(_strided(n, facts) for n in halves) else "split-halves"
    region = RotaryRegion(index=index, anchor=concat, nodes=nodes, spelling=spelling, values=values)
    return _with_outputs(region, output)


def _strided(node: ir.Node, facts: GraphFacts) -> bool:
    """A Slice with a step other than 1: x's even or odd features (DeepSeek's ``rope_interleave``)."""
    steps = facts.const(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    return steps is not None and bool((steps != 1).any())


def _is_half(value: ir.Value) -> bool:
    """A piece of a tensor: a ``Slice``, or an output of a ``Split`` (``torch.chunk`` as dynamo writes it)."""
    node = value.producer()
    return node is not None and node.op_type in ("Slice", "Split") and node.domain in ("", "ai.onnx")


def _halves_spelling(concat: ir.Node) -> bool:
    """``Concat(Sub(Mul, Mul), Add(Mul, Mul))`` whose products read two slices of one tensor, each once on each
    side: x's halves rotated apart — the shape of a rotation, before any proof."""
    sub, add = (producer(v) for v in concat.inputs)
    if sub is None or add is None or sub.op_type != "Sub" or add.op_type != "Add":
        return False
    sides = []
    for node in (sub, add):
        products = [producer(v) for v in node.inputs]
        if any(m is None or m.op_type != "Mul" for m in products):
            return False
        sides.append({v for m in products for v in m.inputs if v is not None and _is_half(v)})
    if len(sides[0]) != 2 or sides[0] != sides[1]:
        return False
    first, second = (v.producer() for v in sides[0])
    return first.inputs[0] is second.inputs[0]  # one Split's two outputs, or two Slices of one tensor


def _rotate_nodes(concat: ir.Node) -> set[ir.Node]:
    members, frontier = {concat}, [v for v in concat.inputs if v is not None]
    while frontier:  # Unsqueeze, Neg, Slice back to the rotated tensor
        node = frontier.pop().producer()
        if node is not None and node.op_type in ("Unsqueeze", "Neg", "Slice") and node not in members:
            members.add(node)
            if node.op_type != "Slice":
                frontier.append(node.inputs[0])
    return members


def _reader(value: ir.Value) -> ir.Node | None:
    """The one node that computes with ``value`` (nodes that read only its type or shape aside)."""
    readers = {use.node for use in value.uses() if not reads_type_only(use.node, value)}
    return readers.pop() if len(readers) == 1 else None


def _around(anchor: ir.Node, members: set[ir.Node], facts: GraphFacts) -> tuple[RotationValues, set[ir.Node]]:
    """The products, the sum and the partial rotation's ends around ``rotate(x)``, with the table ops; and the
    values of each step (the output ``rotate(x)`` itself where they are not there)."""
    rotated = anchor.outputs[0]
    mul_sin = single_consumer(rotated)
    cast = None
    if mul_sin is not None and mul_sin.op_type == "Cast":  # rotated in half precision and cast up (ERNIE 4.5)
        cast, mul_sin = mul_sin, single_consumer(mul_sin.outputs[0])
    if mul_sin is None or mul_sin.op_type != "Mul":
        return RotationValues(rotated, None, None, None, rotated), set()
    around, term = {mul_sin, cast}, mul_sin.outputs[0]
    add = _reader(term)
    if add is not None and add.op_type == "Mul" and any(facts.const(v) is not None for v in add.inputs):
        around.add(add)  # torchlib's add(x, y, alpha): y · alpha, then the sum
        term, add = add.outputs[0], _reader(add.outputs[0])
    if add is None or add.op_type != "Add":
        return RotationValues(rotated, mul_sin.outputs[0], None, None, rotated), set()
    around.add(add)
    mul_cos = next((v.producer() for v in add.inputs if v is not term and v is not None), None)
    slices = [n for n in members if n.op_type == "Slice"]
    kept = {rotated} | {n.inputs[0] for n in slices} | ({cast.outputs[0]} if cast is not None else set())
    for value in list(kept):  # x cast up only to be rotated (ModernBERT's float16 export casts it once a term)
        node = value.producer()
        if node is not None and node.op_type == "Cast" and all(use.node in members for use in value.uses()):
            around.add(node)
            kept.add(node.inputs[0])
    for product in (mul_sin, mul_cos):
        if product is not None and product.op_type == "Mul":
            around.add(product)
            for value in product.inputs:  # x itself, or x cast up (a half model's rotation in float32), is no table
                if value is not None and _cast_of(value, kept):
                    around.add(value.producer())  # the cast, read as one: the sin term casts rotate(x) alike
                elif value is not None and value not in kept:
                    around |= _table_nodes(value)
    output = add.outputs[0]
    source = slices[0].inputs[0].producer() if slices else None
    putback = _putback(output, source, facts)
    if putback is not None:
        around |= {source, putback} | {v.producer() for v in putback.inputs if v is not None}
        output = putback.outputs[0]
    cos_term = mul_cos.outputs[0] if mul_cos is not None else None
    values = RotationValues(rotated, mul_sin.outputs[0], cos_term, add.outputs[0], output)
    return values, {n for n in around if n is not None}


def _putback(output: ir.Value, source: ir.Node | None, facts: GraphFacts) -> ir.Node | None:
    """The ``Concat`` that puts a partial rotation's other features back, where it is the op's partial form:
    the rotated first features first (``source`` a Slice of x). Where the rest comes first (DeepSeek's MLA joins
    its unrotated part before the rotated one) the rotation ends at its own output and the join stays the
    graph's."""
    putback = single_consumer(output)
    if source is None or source.op_type != "Slice" or not _on_features(putback, facts):
        return None
    return putback if putback.inputs[0] is output else None


def _on_features(concat: ir.Node | None, facts: GraphFacts) -> bool:
    """A Concat along the last axis: a partial rotation's features put back. One along the sequence (timm's EVA
    rotates the patch tokens and puts the class token back in front) is the graph's own, after the rotation."""
    if concat is None or concat.op_type != "Concat" or "axis" not in concat.attributes:
        return False
    rank, axis = facts.rank(concat.outputs[0]), int(concat.attributes["axis"].value)
    return axis == -1 or (rank is not None and axis == rank - 1)


def _cast_of(value: ir.Value, sources: set[ir.Value]) -> bool:
    node = value.producer()
    return node is not None and node.op_type == "Cast" and node.inputs[0] in sources


def _table_nodes(value: ir.Value) -> set[ir.Node]:
    found: set[ir.Node] = set()
    frontier = [(value, 0)]
    while frontier:
        value, depth = frontier.pop()
        node = value.producer()
        if node is None or node in found or depth > _MAX_TABLE_DEPTH or node.op_type not in _TABLE_OPS:
            continue
        if node.domain not in ("", "ai.onnx"):
            continue
        found.add(node)
        for v in node.inputs:
            if v is not None and v.dtype is not None and v.dtype.is_floating_point():
                frontier.append((v, depth + 1))
    return found


def producer(value: ir.Value | None) -> ir.Node | None:
    return None if value is None else value.producer()


def _spelling(concat: ir.Node) -> str | None:
    """``Concat(Neg(Slice(x)), Slice(x))`` is rotate-half; the same with an ``Unsqueeze`` on each side is
    interleaved; x's halves rotated apart and joined is split-halves — the shape of a rotation, before any
    proof."""
    if concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") or len(concat.inputs) != 2:
        return None
    if _halves_spelling(concat):
        return "split-halves"
    first, second = (producer(v) for v in concat.inputs)
    spelling = "rotate-half"
    if first is not None and second is not None and first.op_type == second.op_type == "Unsqueeze":
        first, second, spelling = producer(first.inputs[0]), producer(second.inputs[0]), "interleaved"
    if first is None or second is None or first.op_type != "Neg" or second.op_type != "Slice":
        return None
    negated = producer(first.inputs[0])
    if negated is None or negated.op_type != "Slice" or negated.inputs[0] is not second.inputs[0]:
        return None
    return spelling


def write(region: Region, writer: RegionWriter) -> RotaryReport:
    """The rotation written where extraction chose ``rotary`` for its output, or kept with the reason; its
    entry lists the forms its e-class held, priced."""
    assert isinstance(region, RotaryRegion)
    reader = writer.reader(region)
    variant_name = variant(region.values, region.spelling, reader)
    entry = RotaryReport(region.index, region.main_output.name or "", Status.NOT_FUSED, variant=variant_name)
    entry.functions = functions.origin([region.anchor], writer.origins)
    main = writer.class_of.get(region.main_output)
    entry.candidates = writer.price(main) if main is not None else []
    chosen = writer.choice[main].node if main is not None and main in writer.choice else None
    if chosen is None or chosen.op not in ROTARY_OPS:
        entry.reason = _explain(region, writer, main, reader)
        return entry
    if (KIND.name, region.index) in writer.excluded:
        entry.status = Status.ROLLED_BACK
        entry.reason, entry.max_abs_diff = writer.excluded[KIND.name, region.index]
        return entry
    try:
        written = writer.write_chosen(region, "rope")
    except (ValueError, KeyError) as err:
        entry.reason = str(err)
        return entry
    entry.status, entry.fused_into = Status.FUSED, written.label
    return entry


def _explain(region: RotaryRegion, writer: RegionWriter, main, reader: ClassReader) -> str:
    """Why no ``RotaryEmbedding`` was chosen: the rules proved no rotation (the structural check says where it
    differs from one), or the target has no kernel for it."""
    proven = main is not None and any(n.op in ROTARY_OPS for n in writer.classes.get(main, ()))
    if not proven:
        return why_not(region.values, region.spelling, reader)
    dtype = region.main_output.dtype
    kind = np.dtype(dtype.numpy()).name if dtype is not None else "its element type"
    return writer.target.no_rotary or f"onnxruntime has no RotaryEmbedding kernel for {kind}"


KIND = RegionKind(name="rotary", report_list="rotary", find=find, write=write, claims_first=True)
