"""The mask a fused op gets: the graph's additive mask broadcast to (…, S, T), its select fills written so
every kernel computes what the primitive ops did (a fully masked row stays the mean of V), and finfo.min
entries moved one ulp up for the standard op, which reads them as −inf.

The numbers fills are written as are :mod:`egfuse.writing.mask_fills`' (re-exported here); what the mask's terms hold,
which decides how it is written, is read by :class:`~egfuse.writing.mask_terms.MaskTerms`."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim
from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass
from egfuse.writing.mask_fills import HALF_LOWEST, absorbing_scale, float_info, mask_fill, moved_lowest, scalable
from egfuse.writing.mask_terms import WIDE_ARITHMETIC, MaskTerms
from egfuse.writing.node_builder import NodeBuilder

__all__ = ["MaskWriter", "absorbing_scale", "float_info", "mask_fill", "moved_lowest", "scalable"]


class MaskWriter(MaskTerms, NodeBuilder):
    """The mask part of :class:`~egfuse.writing.raise_.Emitter` (which supplies the chosen terms and their values)."""

    fill_scales: dict[EClass, float]
    assumed_fills: list[float]
    wide_memo: dict[EClass, ir.Value]

    def value(self, cid: EClass) -> ir.Value:
        raise NotImplementedError

    def bias(
        self,
        cid: EClass,
        query: ir.Value,
        key: ir.Value,
        q_axis: int,
        k_axis: int,
        key_length: tuple[ir.Value, Dim | None] | None = None,
        wide: bool = False,
    ) -> ir.Value | None:
        """The additive mask, broadcast to (…, S, T): the kernels index it by query row without broadcasting
        (``wide``: computed in float32, :meth:`wide_value`).
        ``key_length`` overrides T (the value to read it from, and its dim where known; read from ``key``'s
        shape otherwise). The mask goes as it is only where its last two dims are provably S and T: a mask
        (B, 1, 1, T) of a decode step traced at one token keeps the name ``sequence`` for its query axis while
        the op's query axis is the grouped heads (transformers' GQA written as Q (B, N_kv, N/N_kv, H))."""
        if self.choice[cid].node.op == "no_bias":
            return None
        self.mark_exact_fills(cid)
        mask = self.wide_value(cid) if wide else self.value(cid)
        known = self.facts.shape(self.leaf_value(cid))  # None for a term the rules built
        s_dim = _axis_dim(self.facts.shape(query), q_axis)
        t_dim = key_length[1] if key_length is not None else _axis_dim(self.facts.shape(key), k_axis)
        if known is not None and len(known) == 4 and None not in (s_dim, t_dim) and known[2:] == (s_dim, t_dim):
            return mask
        ones = self.const(np.array([1, 1], np.int64), "ones")
        s = self.shape(query, q_axis, q_axis + 1)
        t = key_length[0] if key_length is not None else self.shape(key, k_axis, k_axis + 1)
        target = self.node("Concat", [ones, s, t], {"axis": 0})
        return self.node("Expand", [mask, target], like=mask)

    def fill_number(self, cid: EClass, fill: float, dtype: np.dtype) -> float:
        """The number a select fill ``cid`` is written as in ``dtype``: the graph's own where the mask holds
        other terms (:meth:`mark_exact_fills`), else :func:`mask_fill`'s, times its absorbing factor."""
        scale = self.fill_scales.get(cid, 1.0)
        number = fill if scale == 1.0 and cid in self.exact_fills else mask_fill(fill, dtype, scale)
        if number != fill and scalable(fill):  # written as absorbing: the fused op assumes it hides its keys
            self.assumed_fills.append(fill)
        return number

    def wide_value(self, cid: EClass) -> ir.Value:
        """The mask ``cid`` computed in float32: its select fills written as float32 numbers (times the factor
        :meth:`mark_exact_fills` gave them, so they absorb float32 scores), the selects and sums over them
        redone in float32, and any other term (a graph value, a cast) read as it is and widened. For a
        half-precision model whose softmax a writer computes in float32: a float16 fill cannot absorb a float32
        score, and a float16 sum of a score and ``finfo.min`` overflows; the graph selects the fill itself."""
        if cid in self.wide_memo:
            return self.wide_memo[cid]
        node = self.choice[cid].node
        if node.op == "full_like":
            fill = float(view(node).fill)
            if fill in HALF_LOWEST:  # the end of the half type's range stays at the end of float32's (moved
                # one ulp up where the standard op would read it as −inf: see mask_fill), never scaled
                wide_type = np.dtype(np.float32)
                fill = float(np.finfo(wide_type).min) if cid in self.exact_fills else moved_lowest(wide_type)
            else:
                fill = self.fill_number(cid, fill, np.dtype(np.float32))
            wide = self.const(np.array(fill, np.float32), "fill")
        elif node.op == "where":
            a = view(node)
            wide = self.node("Where", [self.value(a.cond), self.wide_value(a.a), self.wide_value(a.b)])
        elif node.op in WIDE_ARITHMETIC:
            wide = self.node(WIDE_ARITHMETIC[node.op], [self.wide_value(c) for c in node.children])
        elif (array := self._half_constant(cid)) is not None:  # a clamp's bound: a fill, so the ends stay ends
            info = float_info(array.dtype)
            widened = array.astype(np.float32)
            widened[array == info.min], widened[array == info.max] = np.finfo(np.float32).min, np.finfo(np.float32).max
            wide = self.const(widened, "fill")
        else:
            value = self.value(cid)
            wide = value if value.dtype == ir.DataType.FLOAT else self.node("Cast", [value], {"to": ir.DataType.FLOAT})
        wide.dtype = ir.DataType.FLOAT
        self.wide_memo[cid] = wide
        return wide

    def mark_exact_fills(self, cid: EClass) -> None:
        """Note the select fills of the mask ``cid`` to write exactly: all of them, unless the mask is made of
        fills alone; and give its finite fills the factor that makes them absorb the scores
        (:meth:`_scale_finite_fills`).

        ``S + Where(m, b, F)`` and ``S + (Where(m, 0, F) + b)`` are the graph's select masks exactly in float32
        for F = finfo.min: where m is false they give F + b or F (−inf where b = finfo.min too; S + F rounds
        to F for any |S| < 2^103). With F moved one ulp up that no longer holds next to a term b that holds
        finfo.min: an entry S + finfo.min = finfo.min falls below the moved fill, so a left-padded causal row
        (GPT-2/GPT-Neo eager: causal ``Where``, then ``(1 − m)·finfo.min``) put all its weight on the keys the
        fill masked instead of spreading it over both. A mask of fills alone may be moved: every masked entry
        of a row moves with it."""
        fills: list[EClass] = []
        stack, seen, fills_only = [cid], set(), True
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            node = self.choice[current].node
            if node.op == "full_like":
                fills.append(current)
            elif node.op == "where":  # the condition is not a mask value
                stack.extend((view(node).a, view(node).b))
            elif node.op in ("add", "sub", "mul", "div", "maximum"):  # maximum: a clamp moved onto the mask
                stack.extend(node.children)
            else:
                fills_only = False
        if not fills_only:
            self.exact_fills.update(fills)
        self._scale_finite_fills(fills)

    def _scale_finite_fills(self, fills: list[EClass]) -> None:
        """Give the finite select fills of a mask one power-of-two factor that makes them absorb any score
        (:func:`absorbing_scale`).

        The rules moved the select onto the scores (``Where(m, S, F)`` → ``S + Where(m, 0, F)``), which is the
        graph's meaning only while ``S + F`` rounds back to F: a query row whose every key is masked is uniform
        in the graph (the select replaced its scores) but the softmax of ``S + F`` in the fused op — the same
        for F = −1e9 only while |S| < 32 in float32. Scaled by 2^k to at least 1e30 in magnitude, F absorbs
        every score; masked keys of other rows still get weight exp(F − max) = 0; one factor for every fill
        of the mask keeps how the fills and their sums compare; and a term beside them that is 0, finfo.min
        or −inf where they mask (a causal mask) sums with F·2^k as with F (finfo.min absorbs both). A term
        with other values there (a bias added after the select) is the graph's own rounding of F + b, which
        neither form keeps for large scores: validation's large-scores feeds decide. A fill already given
        another factor by another mask keeps it."""
        values = [float(view(self.choice[f].node).fill) for f in fills]
        scale = absorbing_scale(values, len(fills))
        if scale is not None:
            for f, value in zip(fills, values, strict=True):
                if scalable(value):
                    self.fill_scales.setdefault(f, scale)

    def finite_mask(self, bias: EClass, mask: ir.Value | None) -> ir.Value | None:
        """``mask`` with its entries equal to finfo.min moved up (:func:`moved_lowest`), for onnxruntime's standard
        ``Attention``: it reads such an entry as −inf (a row masked entirely that way gives 0), where the graph
        adds it to a score and gets finfo.min, finite and tied with the row's other masked entries (a
        left-padded query row under a causal mask is uniform over them). Masks that cannot hold finfo.min —
        select fills this emitter wrote (:func:`mask_fill`), constants without it — are left as they are."""
        if mask is None or mask.dtype is None or not self._may_hold_lowest(bias):
            return mask
        dtype = np.dtype(mask.dtype.numpy())
        if (info := float_info(dtype)) is None or dtype == ml_dtypes.bfloat16:
            # bfloat16's finfo.min is no float32 number's end: a kernel that computes in float32 reads it as
            # finite (and onnxruntime has no Equal for bfloat16 to move it with, on any provider)
            return mask
        lowest = info.min
        is_lowest = self.node("Equal", [mask, self.const(np.array(lowest, dtype), "lowest")])
        above = self.const(np.array(moved_lowest(dtype), dtype), "fill")
        return self.node("Where", [is_lowest, above, mask], like=mask)


def _axis_dim(shape: tuple[Dim | None, ...] | None, axis: int) -> Dim | None:
    """The dim at ``axis`` of a known shape (``None`` where the shape, or that dim, is unknown)."""
    return None if shape is None or not -len(shape) <= axis < len(shape) else shape[axis]
