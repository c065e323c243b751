"""What a mask's chosen terms hold, read before it is written: select fills, clamps at a half type's finfo.min,
sums that may leave float16's range, entries that may equal finfo.min.

These questions decide how the mask is written (in float32 for a half-precision op, moved off finfo.min for
the standard op) but write nothing; they are the half of :class:`~egfuse.writing.raise_masks.MaskWriter` that only
reads the extracted terms.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_ir as ir

from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.enodes import view
from egfuse.egraph.extract import Choice
from egfuse.egraph.session import EClass, ENode
from egfuse.rules.masks import MASK_FILL_MAX
from egfuse.writing.mask_fills import HALF_LOWEST, LOWEST, float_info

WIDE_ARITHMETIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "neg": "Neg"}
"""Mask arithmetic :meth:`MaskWriter.wide_value` redoes in float32 (over fills it writes in float32)."""


class MaskTerms:
    """Reads of a mask's chosen terms (a mixin of :class:`~egfuse.writing.raise_masks.MaskWriter`, whose emitter
    supplies the choice, the graph's facts and the leaves' values)."""

    choice: dict[EClass, Choice]
    facts: GraphFacts
    exact_fills: set[EClass]

    def leaf_value(self, cid: EClass) -> ir.Value | None:
        raise NotImplementedError

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
        scores its feeds make keep clear of it (:mod:`egfuse.validation.fill_reach`)."""
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
            elif node.op in WIDE_ARITHMETIC:
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
        :meth:`~egfuse.analysis.facts.GraphFacts.finite_magnitude`; None where none is known."""
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
            return float(view(node).fill) in HALF_LOWEST
        array = self._half_constant(cid)
        return array is not None and bool((array == float_info(array.dtype).min).any())

    def _may_hold_lowest(self, cid: EClass) -> bool:
        node = self.choice[cid].node
        if node.op == "full_like":  # written exactly when summed (a lowest fill moved otherwise)
            return cid in self.exact_fills and float(view(node).fill) in LOWEST
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
