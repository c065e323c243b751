"""The nodes' ``metadata_props``, set aside while a model is fused and put back on the nodes that remain.

Why: a dynamo export's source map (five entries a node: the module, the stack, the FX node) is a third of a
graph without its weights, and no stage reads it: shape inference, the version converter, onnx's checker and
onnxruntime ignore it, and the search never looks. Yet each stage that copies the graph copied it too — the
inference and memory probes, the IR deserialized and serialized again, both validation sessions' bytes —
about 40 ms of a 48-layer BERT's 0.75 s. So it is taken off once, after loading, and each node of the result
that has the name and op of a node of the input gets that node's entries back: what fusion kept carries its
source map, what it wrote carries none (as before).

Only where the graph's node names identify them (present and each used once) and the weights are small (the
copy without metadata is a copy of the model); otherwise the model goes through with its metadata, as before.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from egfuse.files import protos

__all__ = ["SetAside", "set_aside"]


@dataclass(frozen=True)
class SetAside:
    """The entries taken off, by node name, with the op they belonged to."""

    entries: dict[str, tuple[str, str, list[onnx.StringStringEntryProto]]]
    """Node name → (domain, op type, its ``metadata_props``) as the input held them."""

    def put_back(self, model: onnx.ModelProto) -> None:
        """Each top-level node of ``model`` named as an input node, of the same op and without entries of its own,
        gets that node's entries again (in place)."""
        for node in model.graph.node:
            kept = self.entries.get(node.name)
            if kept is not None and kept[:2] == (node.domain, node.op_type) and not node.metadata_props:
                node.metadata_props.extend(kept[2])


def set_aside(model: onnx.ModelProto, *, in_place: bool = False) -> tuple[onnx.ModelProto, SetAside | None]:
    """A copy of ``model`` without its top-level nodes' ``metadata_props`` and what was taken off; ``model`` and
    None where nothing is to gain or the names cannot bring the entries back (``model`` itself is never
    changed: it is the caller's, and what a fusion that changed nothing hands back). ``in_place``: ``model`` is
    egfuse's own (read from a file), so the entries are taken off it rather than a copy — a copy of a 48-layer
    BERT's 10 MB of weights, 8 ms — and :meth:`SetAside.put_back` gives them back if it is handed back."""
    nodes = model.graph.node
    if not any(node.metadata_props for node in nodes) or protos.weight_bytes(model) > protos.DETACH_BYTES:
        return model, None
    names = Counter(node.name for node in nodes)
    if "" in names or any(count > 1 for count in names.values()):
        return model, None
    entries = {node.name: (node.domain, node.op_type, list(node.metadata_props)) for node in nodes
               if node.metadata_props}  # fmt: skip
    lean = model if in_place else onnx.ModelProto()
    if lean is not model:
        lean.CopyFrom(model)
    for node in lean.graph.node:
        node.ClearField("metadata_props")
    return lean, SetAside(entries)
