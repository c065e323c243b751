"""Writing new ONNX nodes: named after the rewrite that writes them, typed, collected for insertion — and
one value put in another's place under its name. Shared by attention raising and RoPE."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


class NodeBuilder:
    """Names and collects the nodes a rewrite writes (the caller inserts ``new_nodes`` where they belong)."""

    def __init__(self, graph: ir.Graph, prefix: str, opset: int = 18) -> None:
        self.graph = graph
        self.prefix = prefix
        self.opset = opset
        """The model's default-domain opset: what the plain ops written here may use."""
        self.new_nodes: list[ir.Node] = []
        self.created: set[ir.Value] = set()
        self._counter = 0

    def _name(self, hint: str) -> str:
        self._counter += 1
        return f"{self.prefix}/{hint}_{self._counter}"

    def node(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict[str, object] | None = None,
        domain: str = "",
        like: ir.Value | None = None,
    ) -> ir.Value:
        return self.node_outputs(op, inputs, attrs, domain, like)[0]

    def node_outputs(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict[str, object] | None = None,
        domain: str = "",
        like: ir.Value | None = None,
        count: int = 1,
    ) -> list[ir.Value]:
        name = self._name(op)
        node = ir.Node(domain, op, inputs, attributes=_attributes(attrs or {}), name=name, num_outputs=count)
        for i, out in enumerate(node.outputs):
            out.name = name if i == 0 else f"{name}/{i}"
            self.created.add(out)
        if like is not None and like.dtype is not None:
            node.outputs[0].dtype = like.dtype
        self.new_nodes.append(node)
        return list(node.outputs)

    def const(self, array: np.ndarray, hint: str = "const") -> ir.Value:
        out = self.node("Constant", [], {"value": _tensor(array, self._name(hint))})
        # Typed, so what is computed from it is too: a mask of unknown dtype was passed to the standard op
        # without :meth:`Emitter.finite_mask` (a select mask plus a padding term, GPT-2/GPT-Neo eager).
        out.dtype, out.shape = ir.DataType.from_numpy(np.asarray(array).dtype), ir.Shape(np.asarray(array).shape)
        return out

    def initializer(self, array: np.ndarray, hint: str) -> ir.Value:
        value = ir.Value(name=self._name(hint), const_value=_tensor(array))
        value.dtype = ir.DataType.from_numpy(array.dtype)
        value.shape = ir.Shape(array.shape)
        self.graph.register_initializer(value)
        return value

    def shape(self, x: ir.Value, start: int | None = None, end: int | None = None) -> ir.Value:
        """``Shape(x)[start:end]``: the ``start``/``end`` attributes from opset 15, a ``Slice`` of the whole shape
        before (inputs from opset 10, attributes before that)."""
        if (start is None and end is None) or self.opset >= 15:
            attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
            return self.node("Shape", [x], attrs)
        whole = self.node("Shape", [x])
        first, last = start or 0, 2**63 - 1 if end is None else end
        if self.opset >= 10:
            bounds = [self.const(np.array([b], np.int64), hint) for b, hint in ((first, "at"), (last, "to"))]
            return self.node("Slice", [whole, *bounds])
        return self.node("Slice", [whole], {"starts": [first], "ends": [last], "axes": [0]})

    def take_nodes(self) -> list[ir.Node]:
        """The nodes written since the last call, handed over for insertion."""
        nodes, self.new_nodes = self.new_nodes, []
        return nodes


def replace_output(graph: ir.Graph, old: ir.Value, new: ir.Value, fresh: bool) -> None:
    """Make ``new`` take ``old``'s place and name, so consumers and graph outputs are unchanged."""
    if new is old:
        return
    name = old.name
    if not fresh:
        # ``new`` is an existing value (a leaf): route it through Identity to carry the name.
        node = ir.Node("", "Identity", [new], name=f"{name}/egfuse_identity")
        graph.append(node)
        new = node.outputs[0]
        new.dtype, new.shape = old.dtype, old.shape
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    old.name = f"{name}__replaced"
    new.name = name
    if new.shape is None and old.shape is not None:
        new.shape = old.shape
    if new.dtype is None and old.dtype is not None:
        new.dtype = old.dtype


def _tensor(array: np.ndarray, name: str | None = None) -> ir.Tensor:
    """``ir.tensor(array, name=name)`` for the numpy arrays written here, without its runtime protocol checks (a
    typing ``Protocol`` isinstance per call, a third of writing a layer's constants)."""
    if isinstance(array, np.ndarray):
        return ir.Tensor(array, name=name)
    return ir.tensor(array, name=name)  # type: ignore[return-value]


def _attributes(attrs: dict[str, object]) -> list[ir.Attr]:
    """``ir.convenience.convert_attributes`` for the values written here: ints, floats, text, tensors and lists
    of ints or floats made directly; any other through onnx-ir's inference, which tests a value against the
    graph and tensor protocols first (slow for a tensor or a list: 1,700 protocol checks for a 48-layer BERT)."""
    made = []
    for name, value in attrs.items():
        kind = type(value)
        if kind is int:
            made.append(ir.AttrInt64(name, value))
        elif kind is float:
            made.append(ir.AttrFloat32(name, value))
        elif kind is str:
            made.append(ir.AttrString(name, value))
        elif isinstance(value, ir.Tensor):
            made.append(ir.AttrTensor(name, value))
        elif kind in (list, tuple) and value and all(type(v) is int for v in value):
            made.append(ir.AttrInt64s(name, value))
        elif kind in (list, tuple) and value and all(type(v) is float for v in value):
            made.append(ir.AttrFloat32s(name, value))
        else:
            made.append(ir.convenience.convert_attribute(name, value))  # type: ignore[arg-type]
    return made
