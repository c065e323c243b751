"""Rotary position embeddings (RoPE): the regions a rotation spans, lowered into the e-graph like attention.

Exporters spell RoPE as ``x·cos + rotate(x)·sin`` on the first R of H features of each head (R = H, or
partial: the rest concatenated back unchanged), rotate-half (Llama) or interleaved (GPT-J). A region is found
from the rotation's one unmistakable node, the ``Concat`` that puts ``Neg`` in front, and holds the rotate, the
products, the sum, a partial rotation's ends and the ops its cos/sin tables are computed with. What it
computes is decided by the rules (:mod:`egfuse.rules.rotary`: the tables are proven to repeat what the op
reads), extraction chooses ``RotaryEmbedding`` by cost where the target writes it, and
:mod:`egfuse.rotary_write` writes it. A region the rules prove nothing of keeps its ops; the report says why
(:mod:`egfuse.rotary_check`). A rotation's output is an ordinary value to the attention regions, so a rotation
that is not fused never blocks attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from egfuse.facts import GraphFacts
from egfuse.regions import Region, _with_outputs, reads_type_only, single_consumer
from egfuse.report import RotaryReport, Status
from egfuse.rotary_check import explain
from egfuse.rotary_tables import producer
from egfuse.session import EClass
from egfuse.targets.spec import ROTARY_OPS, FusedOp


@dataclass
class RotaryRegion:
    """A rotation's nodes, found from its anchor: lowered into the e-graph, where the rules decide what it is."""

    region: Region
    anchor: ir.Node  # the node whose output is rotate(x)
    reason: str | None  # what the structural check says is not a fusable rotation (None: it sees none)
    variant: str  # rotate-half or interleaved, partial or not: the report's name for it


_TABLE_OPS = frozenset({"Unsqueeze", "Cos", "Sin", "Cast", "Concat", "Gather", "Mul", "Div", "Identity", "Neg", "Slice",
                        "GatherND", "Transpose",
                        "Expand", "Tile", "Reshape"})  # fmt: skip
"""Ops a cos/sin table is computed with, after its angles: walked back from the products that read it."""
_MAX_TABLE_DEPTH = 8


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
        anchor, members = node, _rotate_nodes(node)
        if spelling == "interleaved":  # the stacked pairs are flattened by the Reshape that reads them
            users = [use.node for use in node.outputs[0].uses() if use.node.op_type != "Shape"]
            anchor = users[0] if len(users) == 1 and users[0].op_type == "Reshape" else node
            members.add(anchor)
        reason, variant = explain(node, anchor, spelling == "interleaved", facts)
        output, around = _around(anchor, members, facts)
        members |= around
        region = Region(index=len(found), softmax=anchor, nodes=sorted(members, key=order.__getitem__))
        found.append(RotaryRegion(_with_outputs(region, output), anchor, reason, variant))
    return found


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


def _around(anchor: ir.Node, members: set[ir.Node], facts: GraphFacts) -> tuple[ir.Value, set[ir.Node]]:
    """The products, the sum and the partial rotation's ends around ``rotate(x)``, with the table ops; and the
    value the rotation computes (``rotate(x)`` itself where they are not there)."""
    rotated = anchor.outputs[0]
    mul_sin = single_consumer(rotated)
    if mul_sin is None or mul_sin.op_type != "Mul":
        return rotated, set()
    around, term = {mul_sin}, mul_sin.outputs[0]
    add = _reader(term)
    if add is not None and add.op_type == "Mul" and any(facts.const(v) is not None for v in add.inputs):
        around.add(add)  # torchlib's add(x, y, alpha): y · alpha, then the sum
        term, add = add.outputs[0], _reader(add.outputs[0])
    if add is None or add.op_type != "Add":
        return rotated, set()
    around.add(add)
    mul_cos = next((v.producer() for v in add.inputs if v is not term and v is not None), None)
    slices = [n for n in members if n.op_type == "Slice"]
    kept = {rotated} | {n.inputs[0] for n in slices}
    for product in (mul_sin, mul_cos):
        if product is not None and product.op_type == "Mul":
            around.add(product)
            for value in product.inputs:
                if value is not None and value not in kept:
                    around |= _table_nodes(value)
    output = add.outputs[0]
    source = slices[0].inputs[0].producer() if slices else None
    putback = single_consumer(output)
    if source is not None and source.op_type == "Slice" and putback is not None and putback.op_type == "Concat":
        around |= {source, putback} | {v.producer() for v in putback.inputs if v is not None}
        output = putback.outputs[0]
    return output, {n for n in around if n is not None}


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


def _spelling(concat: ir.Node) -> str | None:
    """``Concat(Neg(Slice(x)), Slice(x))`` is rotate-half; the same with an ``Unsqueeze`` on each side is
    interleaved — the shape of a rotation, before any proof."""
    if concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx") or len(concat.inputs) != 2:
        return None
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


def write_rotary_regions(
    regions: list[RotaryRegion],
    class_of: dict[ir.Value, EClass],
    classes: dict,
    choice: dict,
    excluded: dict,
    write: Callable[[Region], FusedOp],
    unavailable: str | None,
    price: Callable[[EClass], list[dict]],
) -> list[RotaryReport]:
    """Each region written where extraction chose ``rotary`` for its output (``write(region)`` inserts the
    nodes, or raises ValueError when the op cannot be written); the report entry of each, with the forms its
    e-class held priced by ``price``."""
    entries = []
    for found in regions:
        region = found.region
        entry = RotaryReport(region.index, region.main_output.name or "", Status.NOT_FUSED, variant=found.variant)
        entries.append(entry)
        main = class_of.get(region.main_output)
        entry.candidates = price(main) if main is not None else []
        chosen = choice[main].node if main is not None and main in choice else None
        if chosen is None or chosen.op not in ROTARY_OPS:
            proven = main is not None and any(n.op in ROTARY_OPS for n in classes.get(main, ()))
            if not proven:
                entry.reason = found.reason or "the rules prove no rotation here (a missing identity?)"
            else:
                dtype = region.main_output.dtype
                kind = np.dtype(dtype.numpy()).name if dtype is not None else "its element type"
                entry.reason = unavailable or f"onnxruntime has no RotaryEmbedding kernel for {kind}"
            continue
        if ("rotary", region.index) in excluded:
            entry.status = Status.ROLLED_BACK
            entry.reason, entry.max_abs_diff = excluded["rotary", region.index]
            continue
        try:
            written = write(region)
        except (ValueError, KeyError) as err:
            entry.reason = str(err)
            continue
        entry.status, entry.fused_into = Status.FUSED, written.label
    return entries
