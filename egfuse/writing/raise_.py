"""Chosen terms → ONNX nodes (onnx-ir), written into the graph in place of a region's outputs.

Emission is memoised per e-class, so a tensor the extracted program uses twice is computed once. Each region
output keeps its value name (graph outputs and downstream consumers see no difference); the region's old
nodes become unused and are removed afterwards by dead-node elimination.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.analysis.dims import Dim
from egfuse.analysis.facts import GraphFacts
from egfuse.egraph.enodes import value_index, view
from egfuse.egraph.extract import Choice
from egfuse.egraph.session import EClass, ENode
from egfuse.egraph.shapes import Shape, static
from egfuse.lowering.lower import Lowered
from egfuse.targets.spec import FUSED, TargetSpec
from egfuse.writing.emit_primitives import PRIMITIVE_WRITERS
from egfuse.writing.kv_cache import SEQUENCE_AXIS, CacheConcat, depends_on, find_cache
from egfuse.writing.raise_masks import MaskWriter
from egfuse.writing.writers import WRITERS


class Emitter(MaskWriter):
    """Writes the chosen term of each e-class a region's outputs need, once per e-class (the fused ops
    through the target's writers, the mask through :class:`~egfuse.writing.raise_masks.MaskWriter`)."""

    def __init__(
        self,
        graph: ir.Graph,
        facts: GraphFacts,
        lowered: Lowered,
        classes: dict[EClass, list[ENode]],
        ranks: dict[EClass, object],
        choice: dict[EClass, Choice],
        target: TargetSpec,
        prefix: str,
        shapes: dict[EClass, Shape] | None = None,
        opset: int = 18,
    ) -> None:
        super().__init__(graph, prefix, opset)
        self.shapes = shapes or {}
        self.facts = facts
        self.lowered = lowered
        self.classes = classes
        self.ranks = ranks
        self.choice = choice
        self.target = target
        self.memo: dict[EClass, ir.Value] = {}
        self._fused_memo: dict[EClass, bool] = {}
        self.also_replace: list[tuple[ir.Value, ir.Value]] = []
        """Values outside the region the emitted ops stand in for (a KV cache's Concat outputs)."""
        self.cache_note: str | None = None
        """What happened to a KV-cache Concat feeding the op (for the report)."""
        self.taken_over: dict[ir.Value, ir.Value] = {}
        """Graph values an earlier region's ops replaced, and what replaced them: read instead, so the original
        node is not kept alive by a later region (a residual sum SkipLayerNormalization now returns)."""
        self.graph_values_only = False
        """Operands that are graph values are read as they are, even where their class holds a fused form: a
        norm or activation reads an attention's output as the graph computes it (that region writes its own
        op; writing it again here would duplicate it)."""
        self.fill_scales: dict[EClass, float] = {}
        """Power-of-two factors for finite select fills, so they absorb the scores (see
        :meth:`~egfuse.writing.raise_masks.MaskWriter.mark_exact_fills`)."""
        self.assumed_fills: list[float] = []
        """Finite select fills written scaled to absorb the scores: the fused op equals the graph while the
        scores keep clear of them, which validation checks (:mod:`egfuse.validation.fill_reach`)."""
        self.wide_memo: dict[EClass, ir.Value] = {}
        """Masks written in float32 for a half-precision softmax
        (:meth:`~egfuse.writing.raise_masks.MaskWriter.wide_value`)."""
        self.exact_fills: set[EClass] = set()
        """Select-mask fills (``full_like``) written as the graph's own number, not respelled by
        :func:`~egfuse.writing.raise_masks.mask_fill`: the mask holds other terms (see :meth:`mark_exact_fills`)."""

    def operands(
        self,
        q: EClass,
        k: EClass,
        v: EClass,
        bias: EClass,
        q_axis: int,
        k_axis: int,
        cache_allowed: bool,
        wide: bool = False,
    ) -> tuple[list[ir.Value], ir.Value | None, CacheConcat | None]:
        """Q, K, V and the broadcast mask of a fused op — with K/V the new entries and the cache returned when
        they come from a KV-cache Concat the op can absorb (see :mod:`egfuse.writing.kv_cache`); ``wide``: the mask in
        float32 (:meth:`~egfuse.writing.raise_masks.MaskWriter.wide_value`)."""
        query, key, value = self.value(q), self.value(k), self.value(v)
        cache = None
        if cache_allowed and key not in self.created and value not in self.created:
            cache = find_cache(key, value, self.facts)
        if cache is not None:
            # Checked before the mask's broadcast is emitted: it reads only the mask, Q and the cache's inputs.
            # Its fills are marked first: a fill is written once, with the factor that makes it absorb scores.
            mask_source = None
            if self.choice[bias].node.op != "no_bias":
                self.mark_exact_fills(bias)
                mask_source = self.wide_value(bias) if wide else self.value(bias)
            reads = [query, mask_source, cache.past_key, cache.new_key, cache.past_value, cache.new_value]
            if not depends_on(reads, {cache.present_key, cache.present_value}):
                self.cache_note = "Concat(past, new) absorbed: past_key/past_value in, present outputs from the op"
                length = (self.facts.shape(cache.present_key) or (None,) * 4)[SEQUENCE_AXIS]
                mask = self.bias(bias, query, cache.new_key, q_axis, k_axis, (self.key_length(cache), length), wide)
                return [query, cache.new_key, cache.new_value], mask, cache
            self.cache_note = "Concat(past, new) kept outside: the op's inputs are computed from its output"
        return [query, key, value], self.bias(bias, query, key, q_axis, k_axis, wide=wide), None

    def with_cache(
        self,
        op: str,
        inputs: list[ir.Value | None],
        attrs: dict,
        domain: str,
        like: ir.Value,
        cache: CacheConcat | None,
    ) -> ir.Value:
        """The fused node; with a cache, its present outputs stand in for the cache's Concat outputs."""
        if cache is None:
            return self.node(op, inputs, attrs, domain, like)
        out, present_key, present_value = self.node_outputs(op, inputs, attrs, domain, like, count=3)
        for old, new in ((cache.present_key, present_key), (cache.present_value, present_value)):
            new.dtype, new.shape = old.dtype, old.shape
            self.also_replace.append((old, new))
        return out

    def key_length(self, cache: CacheConcat) -> ir.Value:
        """past + new sequence length, without reading the Concat the op replaces."""
        lengths = [self.shape(v, 2, 3) for v in (cache.past_key, cache.new_key)]
        return self.node("Add", lengths)

    def constant_array(self, cid: EClass) -> np.ndarray:
        node = self.choice[cid].node
        if node.op == "zero_bias":
            weight = self.constant_array(view(node).weight)
            return np.zeros(weight.shape[-1], weight.dtype)
        if node.op == "unit_scale":  # γ = 1, in the normalized input's type
            like = self.value(view(node).like)
            dtype = np.dtype(like.dtype.numpy()) if like.dtype is not None else np.dtype(np.float32)
            return np.ones(int(view(node).width), dtype)
        if node.op == "merge_heads":  # (…, N, H) → (…, N·H) of a constant
            weight = self.constant_array(view(node).a)
            return weight.reshape(*weight.shape[:-2], -1)
        if node.op == "merge_lead":  # (A, second, …) → (A·second, …) of a constant
            weight = self.constant_array(view(node).a)
            return weight.reshape(-1, *weight.shape[2:])
        if node.op == "cast":  # a float32 γ narrowed to a half-precision norm's type (rules/precision.py)
            weight = self.constant_array(view(node).a)
            return weight.astype(ir.DataType(int(view(node).to)).numpy())
        if node.op == "transpose":  # a 1×1 convolution's weight read as a matrix
            weight = self.constant_array(view(node).a)
            return weight.transpose([int(p) for p in view(node).perm.split(",")])
        value = self.value(cid)
        array = self.facts.weight(value)
        if array is None:
            raise ValueError(f"{value.name} is not a constant")
        return array

    def leaf_value(self, cid: EClass) -> ir.Value | None:
        for node in self.classes.get(cid, []):
            if value_index(node) is not None:
                return self.lowered.values[value_index(node)]
        return None

    def rank(self, cid: EClass, emitted: ir.Value) -> int:
        """The rank the e-graph states (``rank_of``, kept through rewrites by ``rules/facts.py``), else the one
        :mod:`~egfuse.egraph.shapes` gives every e-class, else the emitted value's own."""
        if cid in self.ranks:
            return int(self.ranks[cid])
        if self.shapes.get(cid) is not None:
            return len(self.shapes[cid])
        if emitted.shape is not None:
            return len(emitted.shape)
        raise ValueError(f"rank of {emitted.name} unknown")

    def static_dim(self, cid: EClass | None, value: ir.Value, axis: int, what: str) -> int:
        """A dim that must be a number to write the op (a head count, a width split per head)."""
        found = self.static_dim_or_none(cid, value, axis)
        if found is None:
            raise ValueError(f"{what} is not a known number")
        return found

    def static_dim_or_none(self, cid: EClass | None, value: ir.Value, axis: int) -> int | None:
        shape = self.facts.shape(value) if value not in self.created else None
        found = static(shape, axis)
        if found is None and cid is not None:
            found = static(self.shapes.get(cid), axis)
        return found

    def lead_count(self, second: str) -> ir.Value:
        """The size ``split_lead``/``tile_lead`` split off a folded batch, as a 1-element int64 tensor: a number
        as a constant; a symbol (Twins' window count hg·wg, known only when the graph runs) read off the shape
        of a value the written program already reads, whose dims state it. Only an operand's shape can say it
        (the fold's own input is written first, with that dim), and reading it keeps no replaced node alive."""
        if second.isdigit():
            return self.const(np.array([int(second)], np.int64), "windows")
        wanted = Dim.parse(second)
        for cid, value in self.memo.items():
            shape = self.shapes.get(cid) if value in self.created else self.facts.shape(value)
            for axis, dim in enumerate(shape or ()):
                if dim == wanted:
                    return self.shape(value, axis, axis + 1)
        raise ValueError(f"no value the fused op reads has the dim {second} to split off")

    def float_dtype(self, value: ir.Value) -> np.dtype:
        floating = value.dtype is not None and value.dtype.is_floating_point()
        return np.dtype(value.dtype.numpy()) if floating else np.dtype(np.float32)

    def split(self, x: ir.Value, sizes: list[int], axis: int) -> list[ir.Value]:
        """``Split`` into parts of ``sizes`` (the sizes an input from opset 13, an attribute before)."""
        if self.opset >= 13:
            inputs, attrs = [x, self.const(np.array(sizes, np.int64), "split")], {"axis": axis}
        else:
            inputs, attrs = [x], {"axis": axis, "split": sizes}
        return self.node_outputs("Split", inputs, attrs, like=x, count=len(sizes))

    def squeeze(self, x: ir.Value, axis: int) -> ir.Value:
        if self.opset >= 13:
            return self.node("Squeeze", [x, self.const(np.array([axis], np.int64), "axes")], like=x)
        return self.node("Squeeze", [x], {"axes": [axis]}, like=x)

    def unsqueeze(self, x: ir.Value, axis: int) -> ir.Value:
        if self.opset >= 13:
            return self.node("Unsqueeze", [x, self.const(np.array([axis], np.int64), "axes")], like=x)
        return self.node("Unsqueeze", [x], {"axes": [axis]}, like=x)

    # --- terms -----------------------------------------------------------------------------------------------
    def value(self, cid: EClass) -> ir.Value:
        if cid not in self.memo:
            original = self.leaf_value(cid)
            if original is not None and (self.graph_values_only or not self._has_fused(cid)):
                # Unchanged by fusion: reuse the graph's own value (or what an earlier region put in its place).
                self.memo[cid] = self.taken_over.get(original, original)
            else:
                self.memo[cid] = self._emit(self.choice[cid].node, cid)
        return self.memo[cid]

    def emit_chosen(self, cid: EClass) -> ir.Value:
        """``cid``'s chosen term written (its operands through :meth:`value`), even where it is a graph value."""
        if cid not in self.memo:
            self.memo[cid] = self._emit(self.choice[cid].node, cid)
        return self.memo[cid]

    def _has_fused(self, cid: EClass) -> bool:
        if cid not in self._fused_memo:
            self._fused_memo[cid] = False  # cycle guard
            node = self.choice[cid].node
            self._fused_memo[cid] = node.op in FUSED or any(self._has_fused(c) for c in node.children)
        return self._fused_memo[cid]

    def _emit(self, n: ENode, cid: EClass | None = None) -> ir.Value:
        """``n`` written: a primitive by its entry in :data:`~egfuse.writing.emit_primitives.PRIMITIVE_WRITERS`, a fused
        op by the writer the target names for it (:data:`~egfuse.writing.writers.WRITERS`)."""
        if n.op == "ref":
            raise ValueError("a reference to a graph value has no term to write")
        a = view(n)
        write = PRIMITIVE_WRITERS.get(n.op)
        if write is not None:
            return write(self, n, a, cid)
        fused = self.target.op_for(n.op)
        if fused is not None:
            return WRITERS[fused.writer](n, self, fused)
        raise ValueError(f"cannot emit {n.op} for target {self.target.name}")
