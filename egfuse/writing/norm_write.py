"""How ``layer_norm`` / ``rms_norm`` (and their skip forms) and ``gelu`` / ``bias_gelu`` become one op each:
the ``norm`` and ``gelu`` writers.

They share what sets them apart from attention: a standard op that exists only from some opset, and
parameters that must hold one value per feature of the last axis (a broadcast scalar computes the same, but
the ops take only the full width). A failed check is a ValueError: the region keeps its ops and the report
says why.
"""

from __future__ import annotations

import onnx_ir as ir

from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass, ENode
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, FusedOp
from egfuse.writing.emitter_protocol import EmitterProtocol


def norm(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    """``layer_norm`` / ``rms_norm`` as the standard ``LayerNormalization`` / ``RMSNormalization`` over the last
    axis. γ (and β) must be as wide as that axis: a γ of one element broadcast over it is a norm too, but the
    ops take only the full width. Below the op's opset (and not one the model is converted to for the standard
    ops) it cannot be written."""
    a = view(node)
    _check_opset(e, op)
    x = e.value(a.x)
    params = [a.scale] if node.op in ("rms_norm", "skip_rms_norm") else [a.scale, a.bias]
    if node.op in ("skip_layer_norm", "skip_rms_norm"):
        return _skip_layer_norm(node, e, op, x, params)
    inputs = [x, *_per_feature(e, a.x, x, params)]
    return e.node(op.op, inputs, {"axis": -1, "epsilon": float(a.epsilon)}, op.domain, like=x)


def _skip_layer_norm(node: ENode, e: EmitterProtocol, op: FusedOp, x: ir.Value, params: list) -> ir.Value:
    """``SkipLayerNormalization`` or ``SkipSimplifiedLayerNormalization`` (γ alone). The op's fourth output is
    the residual sum: the graph's own sum is replaced by it, so the next residual reads it from the kernel. The
    skip must have the input's rank (the kernel broadcasts no further)."""
    a = view(node)
    skip = e.value(a.skip)
    if e.rank(a.skip, skip) != e.rank(a.x, x) or e.rank(a.x, x) not in (2, 3):  # the kernels take 2 or 3 dims
        raise ValueError("the skip does not have the input's rank, or the input is not 2-D or 3-D")
    # γ and β as their values: the graph's may be computed from the sum (a CastLike to its type), which the
    # op now returns — reading them would close a cycle.
    weights = _per_feature(e, a.x, x, params, as_constants=True)
    outputs = e.node_outputs(op.op, [x, skip, *weights], {"epsilon": float(a.epsilon)}, op.domain, like=x, count=4)
    outputs[1].name = outputs[2].name = ""  # mean and inverse deviation: not computed
    # The graph's own sum: the Add reading both operands (found from their uses, not by a scan of the e-graph).
    adds = (u.node for u in x.uses() if u.node.op_type == "Add" and set(u.node.inputs) == {x, skip})
    original = next((n.outputs[0] for n in adds if n not in e.new_nodes), None)
    if original is not None:
        outputs[3].dtype = x.dtype
        e.also_replace.append((original, outputs[3]))
    return outputs[0]


def gelu(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    """An activation of one input as its op with the op's own attributes: ``gelu`` as ``Gelu`` (exact: no
    ``approximate`` attribute), standard from opset 20 or onnxruntime's; ``gelu_tanh`` as ``Gelu`` with
    ``approximate="tanh"`` or ``FastGelu``. ``bias_gelu`` as ``BiasGelu``, whose bias must be one value per
    feature of the last axis."""
    _check_opset(e, op)
    a = view(node)
    x = e.value(a.x)
    if node.op != "bias_gelu":
        return e.node(op.op, [x], dict(op.attributes), op.domain, like=x)
    return e.node(op.op, [x, *_per_feature(e, a.x, x, [a.bias], hints=("bias",))], {}, op.domain, like=x)


def _check_opset(e: EmitterProtocol, op: FusedOp) -> None:
    """A standard op below its opset cannot be written (unless it is one the model is converted to opset 23
    for, as for the standard Attention)."""
    if op.domain == "" and e.opset < op.opset < STANDARD_ATTENTION_OPSET:
        raise ValueError(f"{op.op} needs opset {op.opset}; the model has {e.opset}")


def _per_feature(
    e: EmitterProtocol,
    x_class: EClass,
    x: ir.Value,
    params: list[EClass],
    *,
    as_constants: bool = False,
    hints: tuple[str, ...] = ("gamma", "beta"),
) -> list[ir.Value]:
    """Scales, shifts and biases as the ops take them: one value per feature of ``x``'s last axis, shape (D,).
    Stored as (1, …, 1, D) (Keras' γ and β) they are written reshaped; one element broadcast over the axis
    computes the same, but the ops take only the full width (a ValueError). ``as_constants``: written as new
    constants even where already (D,)."""
    width = e.static_dim(x_class, x, -1, "the last axis")
    values = []
    for cid, hint in zip(params, hints, strict=False):
        array = e.constant_array(cid)
        if array.shape[-1:] != (width,) or array.size != width:
            raise ValueError(f"a parameter of shape {array.shape} is not one value per feature")
        keep = array.shape == (width,) and not as_constants
        values.append(e.value(cid) if keep else e.const(array.reshape(width), hint))
    return values
