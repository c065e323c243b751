"""How a fused constructor becomes ONNX nodes: one writer per kind of op (``FusedOp.writer``).

Targets name a writer in their spec (:mod:`egfuse.targets.spec`); the emitter (:mod:`egfuse.writing.raise_`) calls it
with the chosen e-node and itself. Writers read operands through the emitter (memoised values, the broadcast
mask, an absorbed KV cache) and write nodes with it; none of them knows which target asked. They see the
emitter as :class:`~egfuse.writing.emitter_protocol.EmitterProtocol`, so no writer imports the module that calls it.

Here: the registry and the fused attention ops (standard ``Attention``, ``MultiHeadAttention``, packed QKV).
The other writers have a module each: :mod:`egfuse.writing.single_head_write`, :mod:`egfuse.writing.norm_write`,
:mod:`egfuse.writing.rotary_write`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass, ENode
from egfuse.targets.spec import FusedOp
from egfuse.writing.emitter_protocol import EmitterProtocol
from egfuse.writing.norm_write import gelu, norm
from egfuse.writing.rotary_write import rotary
from egfuse.writing.single_head_write import THREE_D, single_head


def standard(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    """``attend``/``attend_z`` (4D, grouped K/V heads native) or ``mha``/``mha_standard``/``gqa`` (3D) as one
    standard ``Attention``; a KV cache Concat on 4D K/V goes in as past_key/past_value."""
    a = view(node)
    q, k, v, bias, scale, cap = a.q, a.k, a.v, a.bias, a.scale, a.cap
    three_d = node.op in ("mha", "mha_standard", "gqa")
    seq_axis = 1 if three_d else 2
    # Some float16 masks go in float32 (the op's mask type is free): MaskWriter.widens_for_half. bfloat16 has
    # float32's range: its fills absorb float32 scores as they are.
    wide = e.float_dtype(e.value(q)) == np.float16 and e.widens_for_half(bias)
    allowed = not three_d and op.absorbs_cache
    inputs, mask, cache = e.operands(q, k, v, bias, seq_axis, seq_axis, cache_allowed=allowed, wide=wide)
    mask = e.finite_mask(bias, mask)
    attrs: dict[str, object] = {"scale": float(scale)}
    if float(cap) != 0.0:
        attrs["softcap"] = float(cap)
    if three_d:
        heads = int(a.heads)
        attrs.update(q_num_heads=heads, kv_num_heads=int(a.kv_heads) if node.op == "gqa" else heads)
        inputs[2] = _static_width(e, v, inputs[2])
    if cache is not None:
        args = [*inputs, mask, cache.past_key, cache.past_value]
    else:
        args = [*inputs, mask] if mask is not None else inputs
    out = e.with_cache(op.op, args, attrs, op.domain, inputs[0], cache)
    if node.op == "attend_z" and e.float_dtype(inputs[0]) == np.float16:
        out = _guarded(e, out)
    return out


def _guarded(e: EmitterProtocol, out: ir.Value) -> ir.Value:
    """The graph's NaN guard kept after the op, for float16: the op gives 0 for a row its mask hides with −inf,
    as the guard does, but scores past float16's range (a kernel that computes them in float16, as
    onnxruntime's CPU does) make a NaN row the graph's guard turned into 0."""
    zero = e.const(np.array(0.0, np.float16), "zero")
    return e.node("Where", [e.node("IsNaN", [out]), zero, out], like=out)


def _static_width(e: EmitterProtocol, v: EClass, value: ir.Value) -> ir.Value:
    """V with its last dim stated where the graph's shapes lose it (a packed QKV split by Slices whose ends are
    computed from Shape): onnxruntime infers a 3-D ``Attention``'s output width as 0 when V's width is unknown and
    then refuses the next MatMul at load ("Incompatible dimensions"). A Reshape to (0, 0, width) costs no copy."""
    dims = value.shape
    if dims is not None and len(dims) == 3 and isinstance(dims[2], int):
        return value
    shape = e.shapes.get(v)
    width = shape[-1].static if shape and shape[-1] is not None else None
    if width is None:
        return value
    return e.node("Reshape", [value, e.const(np.array([0, 0, width], np.int64), "shape")], like=value)


def multi_head(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    """``mha`` ((B, T, N·H) K/V) or ``mha_kv4`` ((B, N, T, H) K/V, which may come from a cache) as
    ``com.microsoft.MultiHeadAttention``."""
    a = view(node)
    q, k, v, bias, scale, heads = a.q, a.k, a.v, a.bias, a.scale, a.heads
    kv4 = node.op == "mha_kv4"
    inputs, mask, cache = e.operands(q, k, v, bias, 1, 2 if kv4 else 1, cache_allowed=kv4 and op.absorbs_cache)
    attrs = {"num_heads": int(heads), "scale": float(scale)}
    if cache is not None:
        args = [*inputs, None, None, mask, cache.past_key, cache.past_value]
    else:
        args = [*inputs, None, None, mask] if mask is not None else inputs
    return e.with_cache(op.op, args, attrs, op.domain, inputs[0], cache)


def packed_qkv(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
    """``packed_attention`` as ``com.microsoft.Attention``: the three projections' weights and biases
    concatenated into the op's one weight and bias."""
    a = view(node)
    x, wq, wk, wv, bq, bk, bv, bias, scale, heads = a.x, a.wq, a.wk, a.wv, a.bq, a.bk, a.bv, a.bias, a.scale, a.heads
    xv = e.value(x)
    weights = [e.constant_array(c) for c in (wq, wk, wv)]
    biases = [_flat_bias(e.constant_array(c)) for c in (bq, bk, bv)]
    w = e.initializer(np.concatenate(weights, axis=1), "qkv_weight")
    b = e.initializer(np.concatenate(biases, axis=0), "qkv_bias")
    mask = e.bias(bias, xv, xv, 1, 1)
    attrs: dict[str, object] = {"num_heads": int(heads), "scale": float(scale)}
    sizes = [int(a.shape[1]) for a in weights]
    if len(set(sizes)) > 1:
        attrs["qkv_hidden_sizes"] = sizes
    args = [xv, w, b, None, None, mask] if mask is not None else [xv, w, b]
    return e.node(op.op, args, attrs, domain=op.domain, like=xv)


def _flat_bias(bias: np.ndarray) -> np.ndarray:
    """A projection bias as the 1-D vector packed Attention wants ((1, 1, N·H) → (N·H,))."""
    if bias.size != bias.shape[-1]:
        raise ValueError(f"a bias of shape {bias.shape} does not pack into Attention's 1-D bias")
    return bias.reshape(-1)


WRITERS: dict[str, Callable[[ENode, EmitterProtocol, FusedOp], ir.Value]] = {
    "standard": standard,
    "multi_head": multi_head,
    "packed_qkv": packed_qkv,
    "single_head": single_head,
    "norm": norm,
    "gelu": gelu,
    "rotary": rotary,
}

__all__ = ["THREE_D", "WRITERS"]
