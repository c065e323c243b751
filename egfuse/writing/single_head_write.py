"""Single-head attention (SHA): attention written head by head in plain rank-3 ONNX (the ``single_head``
writer).

NPU toolchains compile rank-3 MatMuls and Transposes well and rank-4 ones, or a fused op, poorly, so the NPU
target writes each head's ``softmax(scale · q Kᵀ + mask) V`` apart. It is the longest writer (grouped heads, a
KV cache read in split-score form, half precision's float32 softmax), so it has a module of its own, in three
pieces: the heads' K and V, what every head's scores share, and one head's attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass, ENode
from egfuse.targets.spec import FusedOp
from egfuse.writing.emitter_protocol import EmitterProtocol
from egfuse.writing.kv_cache import find_cache
from egfuse.writing.mask_fills import float_info

THREE_D = frozenset({"mha", "gqa", "mha_kv4", "packed_attention"})
"""Constructors whose query and output are (B, S, N·H); the others are (B, N, S, H)."""

HeadsKV = list[tuple[list[ir.Value], list[ir.Value]]]
"""K and V split per head, for each part they come in: the one K/V, or a KV cache's past and new entries."""


def single_head(node: ENode, e: EmitterProtocol, op: FusedOp) -> ir.Value:
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
    query = e.value(a.q)
    three_d_q = node.op in THREE_D
    heads = int(a.heads) if three_d_q else e.static_dim(a.q, query, 1, "the query's head count")
    q_heads = _per_head(e, query, heads, three_d=three_d_q, what="query", cid=a.q)
    kv, k_heads, v_heads = _kv_per_head(node, e, heads)
    dtype = e.float_dtype(query)
    half = _is_half(dtype)  # mask and softmax in float32 (see the docstring)
    masks = _per_head_mask(e, a.bias, heads, wide=half)
    scoring = _HeadScoring.of(node, e, query, dtype, kv)
    k_group, v_group = heads // k_heads, heads // v_heads
    outputs = [
        _attend_head(
            e,
            scoring,
            q_heads[i],
            [ks[i // k_group] for ks, _ in kv],
            [vs[i // v_group] for _, vs in kv],
            masks[i] if masks is not None else None,
        )
        for i in range(heads)
    ]
    if three_d_q:
        return e.node("Concat", outputs, {"axis": -1}, like=query)
    return e.node("Concat", [e.unsqueeze(o, 1) for o in outputs], {"axis": 1}, like=query)


def _kv_per_head(node: ENode, e: EmitterProtocol, heads: int) -> tuple[HeadsKV, int, int]:
    """K and V split per head (a KV cache's past and new entries apart: the split-score form), and how many
    heads each has; raises where the query heads do not group over them."""
    a = view(node)
    k, v = a.k, a.v
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
    return kv, k_heads, v_heads


@dataclass(frozen=True)
class _HeadScoring:
    """What every head's attention shares, written once per region: the scale, the softcap, the types the
    scores and softmax are computed in, the NaN guard, and where a KV cache's probabilities split."""

    query: ir.Value
    dtype: np.dtype
    half: bool
    """The scores cast to float32 for the mask and the softmax (see :func:`single_head`)."""
    guard: bool
    cap: float
    scale: ir.Value
    past_end: ir.Value | None
    """The cache's length, where the probabilities split (None without a cache), and the Slice ends after it."""
    to_end: ir.Value | None
    last: ir.Value | None

    @property
    def softmax_dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.half else self.dtype

    @staticmethod
    def of(node: ENode, e: EmitterProtocol, query: ir.Value, dtype: np.dtype, kv: HeadsKV) -> _HeadScoring:
        a = view(node)
        # In float32 for a bfloat16 block, after the scores' cast: the e-graph's scale is the product of the
        # graph's own constants (√s on Q and on K), which bfloat16's 8-bit mantissa would round again (2⁻⁹);
        # float16 keeps it in its own type, which the rules read back as the graph's Cast → Softmax → Cast.
        scale = e.const(np.array(float(a.scale), np.float32 if _scales_wide(dtype) else dtype), "scale")
        past_end = to_end = last = None
        if len(kv) == 2:  # the cache's length, where the probabilities split
            past_end = e.shape(kv[0][0][0], 1, 2)
            to_end, last = e.const(np.array([2**63 - 1], np.int64), "to_end"), e.const(np.array([-1], np.int64), "axis")
        guard = node.op == "attend_z"
        return _HeadScoring(query, dtype, _is_half(dtype), guard, float(a.cap), scale, past_end, to_end, last)


def _attend_head(
    e: EmitterProtocol,
    s: _HeadScoring,
    q_head: ir.Value,
    keys: list[ir.Value],
    values: list[ir.Value],
    mask: ir.Value | None,
) -> ir.Value:
    """One head's ``softmax(scale · q Kᵀ + mask) V`` in rank 3: ``keys``/``values`` its K and V head in each
    part (two for a KV cache: scores against both concatenated, probabilities sliced, the products added)."""
    scores = [e.node("MatMul", [q_head, e.node("Transpose", [k], {"perm": [0, 2, 1]})]) for k in keys]
    logits = scores[0] if len(scores) == 1 else e.node("Concat", scores, {"axis": -1})
    wide = _scales_wide(s.dtype)
    if wide:
        logits = e.node("Cast", [logits], {"to": ir.DataType.FLOAT})
    logits = e.node("Mul", [logits, s.scale])
    if s.cap != 0.0:
        c = e.const(np.array(s.cap, np.float32 if wide else s.dtype), "cap")
        logits = e.node("Mul", [e.node("Tanh", [e.node("Div", [logits, c])]), c])
    if s.half and not wide:
        logits = e.node("Cast", [logits], {"to": ir.DataType.FLOAT})
    if mask is not None:
        logits = e.node("Add", [logits, mask])
    probs = e.node("Softmax", [logits], {"axis": -1})
    if s.guard:
        zero = e.const(np.array(0.0, s.softmax_dtype), "zero")
        probs = e.node("Where", [e.node("IsNaN", [probs]), zero, probs])
    if s.half:
        probs = e.node("Cast", [probs], {"to": ir.DataType.from_numpy(s.dtype)}, like=s.query)
    if len(values) == 1:
        return e.node("MatMul", [probs, values[0]])
    past = e.node("Slice", [probs, e.const(np.array([0], np.int64), "at"), s.past_end, s.last])
    new = e.node("Slice", [probs, s.past_end, s.to_end, s.last])
    return e.node("Add", [e.node("MatMul", [past, values[0]]), e.node("MatMul", [new, values[1]])])


def _scales_wide(dtype: np.dtype) -> bool:
    """bfloat16: the scores are scaled in float32 (see :meth:`_HeadScoring.of`)."""
    return dtype == ml_dtypes.bfloat16


def _is_half(dtype: np.dtype) -> bool:
    """float16 or bfloat16."""
    info = float_info(dtype)
    return info is not None and info.bits <= 16


def _unrepeated(e: EmitterProtocol, cid: EClass) -> EClass:
    """The K or V heads before ``repeat_heads`` (MultiHeadAttention's form needs them repeated; SHA does not)."""
    node = e.choice[cid].node
    return view(node).a if node.op == "repeat_heads" else cid


def _per_head(
    e: EmitterProtocol, x: ir.Value, heads: int, *, three_d: bool, what: str, cid: EClass | None = None
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


def _per_head_mask(e: EmitterProtocol, bias: object, heads: int, wide: bool = False) -> list[ir.Value] | None:
    """The additive mask as one rank-3 (or lower) tensor per head: shared when it does not vary by head
    (``wide``: computed in float32, see :meth:`~egfuse.writing.raise_masks.MaskWriter.wide_value`)."""
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
