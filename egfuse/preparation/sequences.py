"""Sequence ops written as the tensor ops they are: ``ConcatFromSequence(SequenceConstruct(…))`` as a
``Concat``, ``SequenceAt(SplitToSequence(…), i)`` as a ``Slice``.

torch 2.1–2.4's dynamo exporter writes ``torch.cat`` and ``torch.split`` through sequences; the regions and the
e-graph speak tensors only, so without these rewrites RoPE's rotate_half and GPT-2's fused QKV split are
invisible to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from egfuse.preparation.literal_folding import constant_node

if TYPE_CHECKING:
    from egfuse.analysis.facts import GraphFacts


def concat_sequences(graph: ir.Graph) -> int:
    """Replace ``ConcatFromSequence(SequenceConstruct(a, b, …), axis)`` (no new axis) by ``Concat(a, b, …, axis)``:
    torch 2.1's dynamo exporter writes ``torch.cat`` so (RoPE's rotate_half, a partial rotation's putback), and
    the two are the same tensor. Returns how many were replaced."""
    replaced = 0
    for node in list(graph):
        if node.op_type != "ConcatFromSequence" or node.domain not in ("", "ai.onnx"):
            continue
        attr = node.attributes.get("new_axis")
        seq = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
        if (attr is not None and attr.value) or seq is None or seq.op_type != "SequenceConstruct":
            continue
        axis = ir.AttrInt64("axis", node.attributes["axis"].value)
        concat = ir.Node("", "Concat", list(seq.inputs), attributes=[axis], name=node.name)
        concat.outputs[0].dtype = node.outputs[0].dtype
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[concat],
            old_values=node.outputs,
            new_values=concat.outputs,
        )
        replaced += 1
        if not seq.outputs[0].uses():  # left read by nothing: its inputs' readers are the Concat's alone again
            graph.remove(seq, safe=True)
    return replaced


def split_sequence_items(graph: ir.Graph, facts: GraphFacts) -> int:
    """Replace ``SequenceAt(SplitToSequence(x, split, axis), i)`` (known split and i ≥ 0) by the ``Slice`` of x it
    is; returns how many were replaced.

    torch 2.4's dynamo exporter writes ``torch.split`` so (GPT-2's fused QKV projection, ``c_attn(x).split(n,
    dim=2)``): the regions must see Q, K and V as slices of one tensor, as TorchScript's ``Split`` gives them.
    Item i of a split by sizes ``s`` is ``x[sum(s[:i]) : sum(s[:i+1])]`` along the axis; of a split by one size
    ``n`` it is ``x[i·n : (i+1)·n]`` (Slice clips the last, shorter chunk as the split does)."""
    replaced = 0
    for node in list(graph):
        if node.op_type != "SequenceAt" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        split_node = node.inputs[0].producer() if node.inputs[0] is not None else None
        index = facts.const(node.inputs[1])
        if split_node is None or split_node.op_type != "SplitToSequence" or index is None or index.size != 1:
            continue
        i = int(index.reshape(-1)[0])
        sizes = facts.const(split_node.inputs[1]) if len(split_node.inputs) > 1 else None
        if i < 0 or sizes is None or sizes.ndim > 1:
            continue  # a negative index needs the count; no split input means unit chunks squeezed
        if sizes.ndim == 0:
            start, end = i * int(sizes), (i + 1) * int(sizes)
        elif i < sizes.size:
            start, end = int(sizes[:i].sum()), int(sizes[: i + 1].sum())
        else:
            continue
        axis = int(split_node.attributes["axis"].value) if "axis" in split_node.attributes else 0

        named = ((start, "start"), (end, "end"), (axis, "axis"))
        starts, ends, axes = (constant_node(np.array([v], np.int64), f"{node.name}_{label}") for v, label in named)
        slice_ = ir.Node(
            "",
            "Slice",
            [split_node.inputs[0], starts.outputs[0], ends.outputs[0], axes.outputs[0]],
            name=node.name,
        )
        slice_.outputs[0].dtype = split_node.inputs[0].dtype
        ir.convenience.replace_nodes_and_values(
            graph,
            insertion_point=node,
            old_nodes=[node],
            new_nodes=[starts, ends, axes, slice_],
            old_values=node.outputs,
            new_values=slice_.outputs,
        )
        replaced += 1
        if not split_node.outputs[0].uses():
            graph.remove(split_node, safe=True)
    return replaced
