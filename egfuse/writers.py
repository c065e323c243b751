"""How a fused constructor becomes ONNX nodes: one writer per kind of op (``FusedOp.writer``).

Targets name a writer in their spec (:mod:`egfuse.targets.spec`); the emitter (:mod:`egfuse.raise_`) calls it
with the chosen e-node and itself. Writers read operands through the emitter (memoised values, the broadcast
mask, an absorbed KV cache) and write nodes with it; none of them knows which target asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from egfuse.enodes import view
from egfuse.kv_cache import find_cache
from egfuse.raise_masks import float_info
from egfuse.rotary_write import rotary
from egfuse.session import EClass, ENode
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, FusedOp

if TYPE_CHECKING:
    from egfuse.raise_ import Emitter

THREE_D = frozenset({"mha", "gqa", "mha_kv4", "packed_attention"})
"""Constructors whose query and output are (B, S, N·H); the others are (B, N, S, H)."""


def standard(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
    """``attend``/``attend_z`` (4D, grouped K/V heads native) or ``mha``/``gqa`` (3D) as one standard
    ``Attention``; a KV cache Concat on 4D K/V goes in as past_key/past_value."""
    a = view(node)
    q, k, v, bias, scale, cap = a.q, a.k, a.v, a.bias, a.scale, a.cap
    three_d = node.op in ("mha", "gqa")
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


def _guarded(e: Emitter, out: ir.Value) -> ir.Value:
    """The graph's NaN guard kept after the op, for float16: the op gives 0 for a row its mask hides with −inf,
    as the guard does, but scores past float16's range (a kernel that computes them in float16, as
    onnxruntime's CPU does) make a NaN row the graph's guard turned into 0."""
    zero = e.const(np.array(0.0, np.float16), "zero")
    return e.node("Where", [e.node("IsNaN", [out]), zero, out], like=out)


def _is_half(dtype: np.dtype) -> bool:
    """float16 or bfloat16."""
    info = float_info(dtype)
    return info is not None and info.bits <= 16


def _static_width(e: Emitter, v: EClass, value: ir.Value) -> ir.Value:
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


def multi_head(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
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


def packed_qkv(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
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


def single_head(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
    """Single-head attention (SHA), the form NPU toolchains compile well: Q, K and V split per head into
    rank-3 tensors, then per head ``softmax(scale · q Kᵀ + mask) V`` with rank-3 MatMuls and a rank-3
    Transpose, the heads concatenated back. No rank-4 Transpose, no fused op: plain ONNX any runtime runs.

    * Grouped K/V heads (GQA/MQA): query head i reads K/V head i // (N / N_kv), split once, never repeated.
    * The mask is reduced to rank 3 once per region (its head axis squeezed) and shared by every head; a mask
      that differs per head (a position bias) is split like Q.
    * A KV cache ``Concat(past, new)`` is read in the split-score form: scores against the cache and against
      the new keys by two MatMuls, concatenated, one Softmax, sliced, two MatMuls against the cache's and the
      new values, added. The Concat stays only for the present outputs it returns.
    * Half precision: the scaled scores are cast to float32 for the mask and the softmax (the graph's own
      ``Cast → Softmax → Cast``), the mask written in float32 (its fills absorb float32 scores: a float16
      fill added to a score can overflow, and a fully masked row the graph makes uniform would not be)."""
    a = view(node)
    q, k, v, bias, scale, cap = a.q, a.k, a.v, a.bias, a.scale, a.cap
    guard = node.op == "attend_z"
    query = e.value(q)
    three_d_q = node.op in THREE_D
    heads = int(a.heads) if three_d_q else e.static_dim(q, query, 1, "the query's head count")
    q_heads = _per_head(e, query, heads, three_d=three_d_q, what="query", cid=q)
    three_d_kv = node.op in ("mha", "gqa")
    if not three_d_kv:  # K/V heads repeated for an op without grouped heads: each query head reads its group
        k, v = _unrepeated(e, k), _unrepeated(e, v)
    key, value = e.value(k), e.value(v)
    cache = None if three_d_kv or key in e.created or value in e.created else find_cache(key, value, e.facts)
    if three_d_kv:
        k_heads = v_heads = int(a.kv_heads) if node.op == "gqa" else heads
    else:  # K and V may be grouped differently (one repeated by a spelling the rules keep, one not)
        k_heads = e.static_dim(k, key, 1, "the keys' head count")
        v_heads = e.static_dim(v, value, 1, "the values' head count")
    if heads % k_heads or heads % v_heads:
        raise ValueError(f"{heads} query heads do not group over {k_heads} key and {v_heads} value heads")
    parts = [(key, value, k, v)]
    if cache is not None:
        parts = [(cache.past_key, cache.past_value, None, None), (cache.new_key, cache.new_value, None, None)]
    kv = [
        (_per_head(e, kk, k_heads, three_d=three_d_kv, what="keys", cid=kc),
         _per_head(e, vv, v_heads, three_d=three_d_kv, what="values", cid=vc))
        for kk, vv, kc, vc in parts
    ]  # fmt: skip
    if cache is not None:
        e.cache_note = "split-score: scores against the cache and the new keys apart, no Concat inside attention"
    dtype = e.float_dtype(query)
    half = _is_half(dtype)  # mask and softmax in float32 (see the docstring)
    masks = _per_head_mask(e, bias, heads, wide=half)
    k_group, v_group = heads // k_heads, heads // v_heads
    softmax_dtype = np.dtype(np.float32) if half else dtype
    scale_value = e.const(np.array(float(scale), dtype), "scale")
    if len(kv) == 2:  # the cache's length, where the probabilities split
        past_end = e.shape(kv[0][0][0], 1, 2)
        to_end, last = e.const(np.array([2**63 - 1], np.int64), "to_end"), e.const(np.array([-1], np.int64), "axis")
    outputs = []
    for i in range(heads):
        j, jv = i // k_group, i // v_group
        scores = [e.node("MatMul", [q_heads[i], e.node("Transpose", [ks[j]], {"perm": [0, 2, 1]})]) for ks, _ in kv]
        logits = scores[0] if len(scores) == 1 else e.node("Concat", scores, {"axis": -1})
        logits = e.node("Mul", [logits, scale_value])
        if float(cap) != 0.0:
            c = e.const(np.array(float(cap), dtype), "cap")
            logits = e.node("Mul", [e.node("Tanh", [e.node("Div", [logits, c])]), c])
        if half:
            logits = e.node("Cast", [logits], {"to": ir.DataType.FLOAT})
        if masks is not None:
            logits = e.node("Add", [logits, masks[i]])
        probs = e.node("Softmax", [logits], {"axis": -1})
        if guard:
            zero = e.const(np.array(0.0, softmax_dtype), "zero")
            probs = e.node("Where", [e.node("IsNaN", [probs]), zero, probs])
        if half:
            probs = e.node("Cast", [probs], {"to": ir.DataType.from_numpy(dtype)}, like=query)
        if len(kv) == 1:
            outputs.append(e.node("MatMul", [probs, kv[0][1][jv]]))
            continue
        past = e.node("Slice", [probs, e.const(np.array([0], np.int64), "at"), past_end, last])
        new = e.node("Slice", [probs, past_end, to_end, last])
        outputs.append(e.node("Add", [e.node("MatMul", [past, kv[0][1][jv]]), e.node("MatMul", [new, kv[1][1][jv]])]))
    if three_d_q:
        return e.node("Concat", outputs, {"axis": -1}, like=query)
    return e.node("Concat", [e.unsqueeze(o, 1) for o in outputs], {"axis": 1}, like=query)


def _unrepeated(e: Emitter, cid: EClass) -> EClass:
    """The K or V heads before ``repeat_heads`` (MultiHeadAttention's form needs them repeated; SHA does not)."""
    node = e.choice[cid].node
    return view(node).a if node.op == "repeat_heads" else cid


def _per_head(
    e: Emitter, x: ir.Value, heads: int, *, three_d: bool, what: str, cid: EClass | None = None
) -> list[ir.Value]:
    """``heads`` rank-3 tensors of ``x``: (B, S, N·H) split along its last axis, or (B, N, S, H) split along
    its head axis and squeezed."""
    if not three_d:
        return [e.squeeze(p, 1) for p in (e.split(x, [1] * heads, axis=1) if heads > 1 else [x])]
    if heads == 1:
        return [x]
    width = e.static_dim(cid, x, -1, f"the {what}' width")
    if width % heads:
        raise ValueError(f"the {what}' width {width} does not split into {heads} heads")
    return e.split(x, [width // heads] * heads, axis=-1)


def _per_head_mask(e: Emitter, bias: object, heads: int, wide: bool = False) -> list[ir.Value] | None:
    """The additive mask as one rank-3 (or lower) tensor per head: shared when it does not vary by head
    (``wide``: computed in float32, see :meth:`~egfuse.raise_masks.MaskWriter.wide_value`)."""
    if e.choice[bias].node.op == "no_bias":
        return None
    e.mark_exact_fills(bias)
    mask = e.wide_value(bias) if wide else e.value(bias)
    rank = e.rank(bias, mask)
    if rank < 3:
        return [mask] * heads
    if rank > 4:
        raise ValueError(f"a rank-{rank} mask has no per-head form")
    axis = rank - 3  # the head axis of (N or 1, S, T) or (B, N or 1, S, T)
    lead = e.static_dim_or_none(bias, mask, axis)
    if lead == 1:
        return [mask] * heads if rank == 3 else [e.squeeze(mask, 1)] * heads
    if lead is None:  # 1 or N, unknown which: broadcast to N first (rank-4 work, but the meaning is sure)
        widths = np.ones(rank, np.int64)
        widths[axis] = heads
        mask = e.node("Expand", [mask, e.const(widths, "heads")], like=mask)
    return [e.squeeze(p, axis) for p in e.split(mask, [1] * heads, axis)]


def norm(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
    """``layer_norm`` / ``rms_norm`` as the standard ``LayerNormalization`` / ``RMSNormalization`` over the last
    axis. γ (and β) must be as wide as that axis: a γ of one element broadcast over it is a norm too, but the
    ops take only the full width. Below the op's opset (and not one the model is converted to for the standard
    ops) it cannot be written."""
    a = view(node)
    _check_opset(e, op)
    x = e.value(a.x)
    params = [a.scale] if node.op in ("rms_norm", "skip_rms_norm") else [a.scale, a.bias]
    _check_per_feature(e, a.x, x, params)
    if node.op in ("skip_layer_norm", "skip_rms_norm"):
        return _skip_layer_norm(node, e, op, x, params)
    inputs = [x, *(e.value(c) for c in params)]
    return e.node(op.op, inputs, {"axis": -1, "epsilon": float(a.epsilon)}, op.domain, like=x)


def _skip_layer_norm(node: ENode, e: Emitter, op: FusedOp, x: ir.Value, params: list) -> ir.Value:
    """``SkipLayerNormalization`` or ``SkipSimplifiedLayerNormalization`` (γ alone). The op's fourth output is
    the residual sum: the graph's own sum is replaced by it, so the next residual reads it from the kernel. The
    skip must have the input's rank (the kernel broadcasts no further)."""
    a = view(node)
    skip = e.value(a.skip)
    if e.rank(a.skip, skip) != e.rank(a.x, x) or e.rank(a.x, x) not in (2, 3):  # the kernels take 2 or 3 dims
        raise ValueError("the skip does not have the input's rank, or the input is not 2-D or 3-D")
    # γ and β as their values: the graph's may be computed from the sum (a CastLike to its type), which the
    # op now returns — reading them would close a cycle.
    weights = [e.const(e.constant_array(c), hint) for c, hint in zip(params, ("gamma", "beta"), strict=False)]
    outputs = e.node_outputs(op.op, [x, skip, *weights], {"epsilon": float(a.epsilon)}, op.domain, like=x, count=4)
    outputs[1].name = outputs[2].name = ""  # mean and inverse deviation: not computed
    # The graph's own sum: the Add reading both operands (found from their uses, not by a scan of the e-graph).
    adds = (u.node for u in x.uses() if u.node.op_type == "Add" and set(u.node.inputs) == {x, skip})
    original = next((n.outputs[0] for n in adds if n not in e.new_nodes), None)
    if original is not None:
        outputs[3].dtype = x.dtype
        e.also_replace.append((original, outputs[3]))
    return outputs[0]


def gelu(node: ENode, e: Emitter, op: FusedOp) -> ir.Value:
    """``gelu`` as ``Gelu`` (exact: no ``approximate`` attribute), standard from opset 20 or onnxruntime's;
    ``bias_gelu`` as ``BiasGelu``, whose bias must be one value per feature of the last axis."""
    _check_opset(e, op)
    a = view(node)
    x = e.value(a.x)
    if node.op != "bias_gelu":
        return e.node(op.op, [x], {}, op.domain, like=x)
    _check_per_feature(e, a.x, x, [a.bias])
    return e.node(op.op, [x, e.value(a.bias)], {}, op.domain, like=x)


def _check_opset(e: Emitter, op: FusedOp) -> None:
    """A standard op below its opset cannot be written (unless it is one the model is converted to opset 23
    for, as for the standard Attention)."""
    if op.domain == "" and e.opset < op.opset < STANDARD_ATTENTION_OPSET:
        raise ValueError(f"{op.op} needs opset {op.opset}; the model has {e.opset}")


def _check_per_feature(e: Emitter, x_class: EClass, x: ir.Value, params: list[EClass]) -> None:
    """Scales, shifts and biases must hold one value per feature of ``x``'s last axis: one element broadcast
    over it computes the same, but the ops take only the full width."""
    width = e.static_dim(x_class, x, -1, "the last axis")
    for cid in params:
        if e.constant_array(cid).shape != (width,):
            raise ValueError(f"a parameter of shape {e.constant_array(cid).shape} is not one value per feature")


def _flat_bias(bias: np.ndarray) -> np.ndarray:
    """A projection bias as the 1-D vector packed Attention wants ((1, 1, N·H) → (N·H,))."""
    if bias.size != bias.shape[-1]:
        raise ValueError(f"a bias of shape {bias.shape} does not pack into Attention's 1-D bias")
    return bias.reshape(-1)


WRITERS: dict[str, Callable[[ENode, Emitter, FusedOp], ir.Value]] = {
    "standard": standard,
    "multi_head": multi_head,
    "packed_qkv": packed_qkv,
    "single_head": single_head,
    "norm": norm,
    "gelu": gelu,
    "rotary": rotary,
}

__all__ = ["THREE_D", "WRITERS"]
