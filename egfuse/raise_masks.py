"""The mask a fused op gets: the graph's additive mask broadcast to (…, S, T), its select fills written so
every kernel computes what the primitive ops did (a fully masked row stays the mean of V), and finfo.min
entries moved one ulp up for the standard op, which reads them as −inf."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim
from egfuse.enodes import view
from egfuse.extract import Choice
from egfuse.facts import GraphFacts
from egfuse.node_builder import NodeBuilder
from egfuse.rules.masks import ABSORBING_FILL, MASK_FILL_MAX
from egfuse.session import EClass, ENode

_WIDE_ARITHMETIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "neg": "Neg"}
"""Mask arithmetic :meth:`MaskWriter.wide_value` redoes in float32 (over fills it writes in float32)."""

_HALF_LOWEST = frozenset({float(np.finfo(np.float16).min)})
"""float16's finfo.min: in float32 a fill that absorbs any score only at float32's own finfo.min."""
_LOWEST = frozenset(float(ml_dtypes.finfo(t).min) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))
"""finfo.min of each float type, as the f64 a fill is kept as in the e-graph."""


def float_info(dtype: np.dtype) -> ml_dtypes.finfo | None:
    """The float type's limits (bfloat16's too: numpy's own ``finfo`` and ``issubdtype`` do not know it as a
    float), None for any other type."""
    try:
        return ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return None


class MaskWriter(NodeBuilder):
    """The mask part of :class:`~egfuse.raise_.Emitter` (which supplies the chosen terms and their values)."""

    choice: dict[EClass, Choice]
    facts: GraphFacts
    exact_fills: set[EClass]
    fill_scales: dict[EClass, float]
    assumed_fills: list[float]
    wide_memo: dict[EClass, ir.Value]

    def value(self, cid: EClass) -> ir.Value:
        raise NotImplementedError

    def leaf_value(self, cid: EClass) -> ir.Value | None:
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
            if fill in _HALF_LOWEST:  # the end of the half type's range stays at the end of float32's (moved
                # one ulp up where the standard op would read it as −inf: see mask_fill), never scaled
                wide_type = np.dtype(np.float32)
                fill = float(np.finfo(wide_type).min) if cid in self.exact_fills else moved_lowest(wide_type)
            else:
                fill = self.fill_number(cid, fill, np.dtype(np.float32))
            wide = self.const(np.array(fill, np.float32), "fill")
        elif node.op == "where":
            a = view(node)
            wide = self.node("Where", [self.value(a.cond), self.wide_value(a.a), self.wide_value(a.b)])
        elif node.op in _WIDE_ARITHMETIC:
            wide = self.node(_WIDE_ARITHMETIC[node.op], [self.wide_value(c) for c in node.children])
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

    def _half_constant(self, cid: EClass) -> np.ndarray | None:
        """The values of a small half-precision constant of the graph standing in a mask (OPT's clamp at
        finfo.min), None for anything else."""
        leaf = self.leaf_value(cid)
        array = self.facts.const(leaf) if leaf is not None else None
        if array is None or array.size > 64 or (info := float_info(array.dtype)) is None or info.bits > 16:
            return None
        return np.asarray(array)

    def widens_for_half(self, cid: EClass) -> bool:
        """Whether a float16 fused op that adds its mask to float32 scores (the standard ``Attention``, whose mask
        type is free) must get the mask ``cid`` in float32 (:meth:`wide_value`) to compute what the graph did:
        it holds a select fill (the graph replaced the masked scores by it, so a query row whose every key it
        hides is uniform however large the scores, which an additive float16 fill keeps for no kernel that adds
        in float32: |S| > 16 against float16's finfo.min, |S| > 4 against −1e4), a clamp at finfo.min
        (:meth:`clamps_at_lowest`), or a sum that may leave float16's range (:meth:`sum_may_overflow`).

        A finite select fill (−1e4) is written scaled until it absorbs the scores, as in a float32 model
        (:meth:`_scale_finite_fills`): exact on a fully masked row, and on every other row while one of its
        kept keys scores well above the fill. Below that the graph's select hands the row to the masked keys,
        which no additive mask does; the fill is recorded (``assumed_fills``) and validation checks that the
        scores its feeds make keep clear of it (:mod:`egfuse.fill_reach`)."""
        limit = float(np.finfo(np.float16).max)
        return self._holds_select_fill(cid) or self.clamps_at_lowest(cid) or self.sum_may_overflow(cid, limit)

    def _holds_select_fill(self, cid: EClass) -> bool:
        """Whether the mask ``cid`` holds a select fill (a ``full_like`` branch of a select at or below −1e4)."""
        for node in self._mask_terms(cid):
            if node.op != "where":
                continue
            for branch in (view(node).a, view(node).b):
                branch_node = self.choice[branch].node
                if branch_node.op == "full_like" and float(view(branch_node).fill) <= MASK_FILL_MAX:
                    return True  # not a value, nor the 0 of an additive mask's unmasked entries
        return False

    def _mask_terms(self, cid: EClass) -> Iterator[ENode]:
        """The chosen nodes of the mask ``cid``, each once: through selects' branches (a condition is no mask
        value) and the arithmetic :meth:`wide_value` redoes."""
        stack, seen = [cid], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            node = self.choice[current].node
            yield node
            if node.op == "where":
                stack.extend((view(node).a, view(node).b))
            elif node.op in _WIDE_ARITHMETIC:
                stack.extend(node.children)

    def clamps_at_lowest(self, cid: EClass) -> bool:
        """Whether the mask ``cid`` holds a clamp at a half type's finfo.min (OPT's ``max(S + M, finfo.min)``,
        moved onto the mask by the rules: ``S + max(M, finfo.min)``). The graph clamps the sum, so a query row
        whose every key is masked stays finite however large its scores; a fused op adds the scores to the
        clamped mask, and in half precision ``S + finfo.min`` overflows to −inf once S < −16 — a fully masked
        row then gives NaN where the graph gives a number. Written in float32 (:meth:`wide_value`, which takes
        the bound to float32's finfo.min) the sum cannot overflow."""
        return any(
            node.op == "maximum" and any(self._at_half_lowest(c) for c in node.children)
            for node in self._mask_terms(cid)
        )

    def sum_may_overflow(self, cid: EClass, limit: float) -> bool:
        """Whether a sum among the terms of the mask ``cid`` may leave ±``limit`` (the largest float16): two or
        more of its terms may hold finite values other than 0 (:meth:`_term_bound`), and their bounds add up
        past it or one is unknown. A padding term ``(1 − m)·finfo.min`` plus a causal one of finfo.min (GPT-2
        eager), or plus a position bias (T5), sums to −inf in float16 on the keys both hide — where the graph,
        adding the scores first, kept a finite entry (or a clamp caught it) — and a query row all of whose keys
        overflow gives NaN or 0 instead of the graph's value. Summed in float32 (:meth:`wide_value`) they stay
        finite. A term of 0 and −inf (a causal ``Trilu``) adds nothing that can overflow."""
        memo: dict[EClass, float | None] = {}
        for node in self._mask_terms(cid):
            if node.op in ("add", "sub"):
                nonzero = [b for b in (self._term_bound(c, memo) for c in node.children) if b != 0.0]
                if len(nonzero) > 1 and (None in nonzero or sum(nonzero) > limit):
                    return True
        return False

    def _term_bound(self, cid: EClass, memo: dict[EClass, float | None]) -> float | None:
        """An upper bound on ``|x|`` over the finite entries of the mask term ``cid`` (a −inf fill counts as
        nothing): fills by their value, selects by their branches, arithmetic by its operands', graph values by
        :meth:`~egfuse.facts.GraphFacts.finite_magnitude`; None where none is known."""
        if cid in memo:
            return memo[cid]
        memo[cid] = None  # a cycle through the e-graph bounds nothing
        node = self.choice[cid].node
        bound: float | None
        if node.op == "full_like":
            fill = float(view(node).fill)
            bound = abs(fill) if np.isfinite(fill) else 0.0
        elif node.op == "no_bias":
            bound = 0.0
        elif node.op in ("where", "add", "sub", "mul", "maximum", "neg"):
            children = (view(node).a, view(node).b) if node.op == "where" else node.children
            bounds = [self._term_bound(c, memo) for c in children]
            if any(b is None for b in bounds):
                bound = None
            elif node.op in ("add", "sub"):
                bound = float(sum(bounds))
            elif node.op == "mul":
                bound = float(np.prod(bounds))
            else:
                bound = max(bounds)
        else:
            leaf = self.leaf_value(cid)
            bound = self.facts.finite_magnitude(leaf) if leaf is not None else None
        memo[cid] = bound
        return bound

    def _at_half_lowest(self, cid: EClass) -> bool:
        """A fill or small graph constant holding a half type's finfo.min."""
        node = self.choice[cid].node
        if node.op == "full_like":
            return float(view(node).fill) in _HALF_LOWEST
        array = self._half_constant(cid)
        return array is not None and bool((array == float_info(array.dtype).min).any())

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

    def _may_hold_lowest(self, cid: EClass) -> bool:
        node = self.choice[cid].node
        if node.op == "full_like":  # written exactly when summed (a lowest fill moved otherwise)
            return cid in self.exact_fills and float(view(node).fill) in _LOWEST
        if node.op == "no_bias":
            return False
        if node.op == "where":  # the condition is not a mask value
            return any(self._may_hold_lowest(c) for c in (view(node).a, view(node).b))
        if node.op in ("add", "maximum"):  # max(m, finfo.min) is finfo.min wherever m is at or below it
            return any(self._may_hold_lowest(c) for c in node.children)
        leaf = self.leaf_value(cid)
        array = self.facts.const(leaf) if leaf is not None else None
        if array is not None and (info := float_info(array.dtype)) is not None:
            return bool((array == info.min).any())
        return True


def absorbing_scale(fills: list[float], terms: int) -> float | None:
    """The power of two that takes the smallest finite select fill of a mask to at least 1e30 in magnitude
    (float32: ``S + F`` then rounds to F for |S| < 2^75), or None where there is nothing to scale or it is
    not a mask: a fill above −1e4, or a factor that could make ``terms`` of them overflow. Zeros and fills
    that already absorb (−inf, finfo.min, ≤ −1e30) are left out: they keep their values, and compare with
    the scaled fills as with the originals (finfo.min still absorbs them)."""
    finite = [f for f in fills if scalable(f)]
    if not finite or any(0.0 > f > MASK_FILL_MAX or f > 0.0 for f in fills):
        return None
    smallest, largest = min(-f for f in finite), max(-f for f in finite)
    scale = 2.0 ** int(np.ceil(np.log2(-ABSORBING_FILL / smallest)))
    return scale if largest * scale * max(terms, 1) < 1e37 else None


def scalable(fill: float) -> bool:
    """A finite mask fill that does not absorb the scores: one :func:`absorbing_scale` scales."""
    return bool(np.isfinite(fill)) and ABSORBING_FILL < fill <= MASK_FILL_MAX


def mask_fill(fill: float, dtype: np.dtype, scale: float = 1.0) -> float:
    """The number to write for a select mask's fill so every kernel computes what the graph did.

    onnxruntime's standard ``Attention`` reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0
    for a query row masked entirely that way, where the primitive ops give the mean of V. One ulp above
    ``lowest`` means the same to the graph's algebra (added to any score it still rounds to the fill itself, so a
    fully masked row stays uniform) and to every kernel, so every target gets that — for a mask made of fills
    alone: next to another term that may hold ``lowest`` (a padding mask) the moved fill would break their tie,
    so the emitter writes the fill as it is there (:meth:`Emitter.mark_exact_fills`) and the standard op gets
    the whole mask moved instead (:meth:`Emitter.finite_mask`). ``scale``: the factor
    :meth:`MaskWriter.mark_exact_fills` gave a finite fill so it absorbs the scores (float32 and float64)."""
    if scale != 1.0 and dtype in (np.float32, np.float64):  # float16 holds no fill that absorbs float32 scores
        return float(dtype.type(fill * scale))
    info = float_info(dtype)
    if info is not None and fill == float(info.min):
        return moved_lowest(dtype)
    return fill


def moved_lowest(dtype: np.dtype) -> float:
    """What a mask entry of finfo.min is written as for a fused op: one ulp above it in float32 and float64
    (onnxruntime's standard ``Attention`` reads finfo.min itself as −inf); half of it in a half-precision type,
    where a kernel that adds the mask in that type overflows ``S + finfo.min`` to −inf once S < −16 (a query
    row whose every key is masked then gives NaN or 0 on large scores). At half the range a score must pass
    −32752 to overflow, a masked key still gets weight exp(−32752 − max) = 0, and two such fills summed stay
    finite. Widened for the float32 copies validation judges masks on, it is a fill again
    (:func:`egfuse.widen.upcast`)."""
    info = float_info(dtype)
    lowest = info.min
    if info.bits <= 16:
        return float(dtype.type(float(lowest) / 2))
    return float(np.nextafter(lowest, dtype.type(0)))


def _axis_dim(shape: tuple[Dim | None, ...] | None, axis: int) -> Dim | None:
    """The dim at ``axis`` of a known shape (``None`` where the shape, or that dim, is unknown)."""
    return None if shape is None or not -len(shape) <= axis < len(shape) else shape[axis]
