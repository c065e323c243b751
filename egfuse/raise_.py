"""Chosen terms → ONNX nodes (onnx-ir), written into the graph in place of a region's outputs.

Emission is memoised per e-class, so a tensor the extracted program uses twice is computed once. Each region
output keeps its value name (graph outputs and downstream consumers see no difference); the region's old
nodes become unused and are removed afterwards by dead-node elimination.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from egfuse.dims import Dim
from egfuse.enodes import value_index, view
from egfuse.extract import Choice
from egfuse.facts import GraphFacts
from egfuse.kv_cache import SEQUENCE_AXIS, CacheConcat, depends_on, find_cache
from egfuse.lower import Lowered
from egfuse.raise_masks import MaskWriter
from egfuse.session import EClass, ENode
from egfuse.shapes import Shape, static
from egfuse.targets.spec import FUSED, TargetSpec
from egfuse.writers import WRITERS

_SIMPLE = {"matmul": "MatMul", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "where": "Where",
           "isnan": "IsNaN", "sqrt": "Sqrt", "tanh": "Tanh", "reshape": "Reshape", "pow": "Pow",
           "reciprocal": "Reciprocal", "erf": "Erf", "maximum": "Max", "neg": "Neg", "cos": "Cos", "sin": "Sin",
           "rows": "Gather"}  # fmt: skip


class Emitter(MaskWriter):
    """Writes the chosen term of each e-class a region's outputs need, once per e-class (the fused ops
    through the target's writers, the mask through :class:`~egfuse.raise_masks.MaskWriter`)."""

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
        :meth:`~egfuse.raise_masks.MaskWriter.mark_exact_fills`)."""
        self.assumed_fills: list[float] = []
        """Finite select fills written scaled to absorb the scores: the fused op equals the graph while the
        scores keep clear of them, which validation checks (:mod:`egfuse.fill_reach`)."""
        self.wide_memo: dict[EClass, ir.Value] = {}
        """Masks written in float32 for a half-precision softmax (:meth:`~egfuse.raise_masks.MaskWriter.wide_value`)."""
        self.exact_fills: set[EClass] = set()
        """Select-mask fills (``full_like``) written as the graph's own number, not respelled by
        :func:`~egfuse.raise_masks.mask_fill`: the mask holds other terms (see :meth:`mark_exact_fills`)."""

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
        they come from a KV-cache Concat the op can absorb (see :mod:`egfuse.kv_cache`); ``wide``: the mask in
        float32 (:meth:`~egfuse.raise_masks.MaskWriter.wide_value`)."""
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
        if node.op == "merge_heads":  # (…, N, H) → (…, N·H) of a constant
            weight = self.constant_array(view(node).a)
            return weight.reshape(*weight.shape[:-2], -1)
        if node.op == "merge_lead":  # (A, second, …) → (A·second, …) of a constant
            weight = self.constant_array(view(node).a)
            return weight.reshape(-1, *weight.shape[2:])
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
        :mod:`~egfuse.shapes` gives every e-class, else the emitted value's own."""
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

    def _widest(self, inputs: list[ir.Value]) -> list[ir.Value]:
        """A half-precision operand of a sum with a float32 one cast up: that sum is taken in float32
        (:mod:`egfuse.rules.precision`, MPT's scores upcast before a float32 bias), and ONNX adds one type."""
        types = {v.dtype for v in inputs}
        if not {ir.DataType.FLOAT16, ir.DataType.BFLOAT16} & types or ir.DataType.FLOAT not in types:
            return inputs
        wide = ir.DataType.FLOAT
        return [v if v.dtype == wide else self.node("Cast", [v], {"to": wide}) for v in inputs]

    def _has_fused(self, cid: EClass) -> bool:
        if cid not in self._fused_memo:
            self._fused_memo[cid] = False  # cycle guard
            node = self.choice[cid].node
            self._fused_memo[cid] = node.op in FUSED or any(self._has_fused(c) for c in node.children)
        return self._fused_memo[cid]

    def _emit(self, n: ENode, cid: EClass | None = None) -> ir.Value:
        op = n.op
        if op == "ref":
            raise ValueError("a reference to a graph value has no term to write")
        a = view(n)
        if op == "value":
            return self.lowered.values[a.index]
        if op in _SIMPLE:
            inputs = [self.value(c) for c in n.args]
            if op == "add":
                inputs = self._widest(inputs)
            return self.node(_SIMPLE[op], inputs, like=inputs[1] if op == "where" else inputs[0])
        if op == "full_like":
            like = self.value(a.like)
            dtype = np.dtype(like.dtype.numpy() if like.dtype is not None else np.float32)
            return self.const(np.array(self.fill_number(cid, float(a.fill), dtype), dtype=dtype), "fill")
        if op == "zero_bias":
            weight = self.constant_array(a.weight)
            return self.const(np.zeros(weight.shape[-1], weight.dtype), "zero_bias")
        if op == "cast":
            return self.node("Cast", [self.value(a.a)], {"to": int(a.to)})
        if op == "softmax":
            return self.node("Softmax", [self.value(a.a)], {"axis": -1}, like=self.value(a.a))
        if op == "reduce_mean":  # axes an input from opset 18, an attribute before
            x = self.value(a.a)
            if self.opset >= 18:
                return self.node("ReduceMean", [x, self.const(np.array([-1], np.int64), "axes")], like=x)
            return self.node("ReduceMean", [x], {"axes": [-1]}, like=x)
        if op == "transpose":
            x = self.value(a.a)
            return self.node("Transpose", [x], {"perm": [int(p) for p in a.perm.split(",")]}, like=x)
        if op == "concat":
            x, y = self.value(a.a), self.value(a.b)
            return self.node("Concat", [x, y], {"axis": int(a.axis)}, like=x)
        if op == "part":
            x = self.value(a.a)
            start, size = int(a.start), int(a.size)
            bounds = [self.const(np.array([v], np.int64), hint) for v, hint in ((start, "at"), (start + size, "to"))]
            return self.node("Slice", [x, *bounds, self.const(np.array([int(a.axis)], np.int64), "axis")], like=x)
        if op in ("cols_before", "cols_from"):
            x, cut = self.value(a.a), self.lowered.cuts[a.n]
            ends = [self.const(np.array([0], np.int64), "at"), cut] if op == "cols_before" else [
                cut, self.const(np.array([2**63 - 1], np.int64), "to_end")]  # fmt: skip
            return self.node("Slice", [x, *ends, self.const(np.array([-1], np.int64), "axis")], like=x)
        if op in ("unsqueeze", "squeeze"):
            return getattr(self, op)(self.value(a.a), int(a.axis))
        if op == "strided":  # a[..., start::2]
            x = self.value(a.a)
            ins = [self.const(np.array([v], np.int64), "at") for v in (int(a.start), 2**62, -1, 2)]
            return self.node("Slice", [x, *ins], like=x)
        if op == "nan_to_zero":
            x, zero = self.value(a.a), self.value(a.zero)
            return self.node("Where", [self.node("IsNaN", [x]), zero, x], like=x)
        if op in ("split_heads", "merge_heads"):
            x = self.value(a.a)
            rank = self.rank(a.a, x)
            spec = (
                [0] * (rank - 1) + [int(a.heads), int(a.head_dim)] if op == "split_heads" else [0] * (rank - 2) + [-1]
            )
            return self.node("Reshape", [x, self.const(np.array(spec, np.int64), "shape")], like=x)
        if op == "repeat_heads":  # Unsqueeze(x, 2) → Expand(·, (B, N, r, T, H)) → Reshape(·, (B, N·r, T, H))
            x = self.value(a.a)
            times = self.const(np.array([int(a.times)], np.int64), "times")
            axes = self.const(np.array([2], np.int64), "axes")
            wide = self.node("Unsqueeze", [x, axes], like=x)
            shape = self.node("Shape", [x])
            head, tail = (
                self.node(
                    "Slice",
                    [shape, self.const(np.array([s], np.int64), "at"), self.const(np.array([e], np.int64), "to")],
                )
                for s, e in ((0, 2), (2, 4))
            )
            wide = self.node("Expand", [wide, self.node("Concat", [head, times, tail], {"axis": 0})], like=x)
            batch = self.node(
                "Slice", [shape, self.const(np.array([0], np.int64), "at"), self.const(np.array([1], np.int64), "to")]
            )
            target = self.node("Concat", [batch, self.const(np.array([-1], np.int64), "minus_one"), tail], {"axis": 0})
            return self.node("Reshape", [wide, target], like=x)
        if op == "tile_lead":  # Tile(Squeeze(m, 0), (B, 1, …)) with B = like's folded batch / second
            m, like = self.value(a.m), self.value(a.like)
            rank = self.rank(a.m, m)
            squeezed = self.node("Squeeze", [m, self.const(np.array([0], np.int64), "axes")], like=m)
            folded = self.node(
                "Slice", [self.node("Shape", [like]), self.const(np.array([0], np.int64), "at"),
                          self.const(np.array([1], np.int64), "to")],
            )  # fmt: skip
            batch = self.node("Div", [folded, self.lead_count(a.second)])
            ones = self.const(np.ones(rank - 2, np.int64), "ones")
            return self.node("Tile", [squeezed, self.node("Concat", [batch, ones], {"axis": 0})], like=m)
        if op in ("group_heads", "ungroup_heads"):  # Reshape to (B, -1, G, T, X) or (B, -1, T, X)
            x = self.value(a.a)
            middle = [-1, int(a.groups)] if op == "group_heads" else [-1]
            lead, tail = self.shape(x, 0, 1), self.shape(x, 2 if op == "group_heads" else 3)
            spec = self.node("Concat", [lead, self.const(np.array(middle, np.int64), "shape"), tail], {"axis": 0})
            return self.node("Reshape", [x, spec], like=x)
        if op in ("merge_lead", "split_lead"):
            x = self.value(a.a)
            shape = self.shape(x, 2 if op == "merge_lead" else 1)
            if op == "split_lead" and not a.second.isdigit():  # a count only the run knows, read off the graph
                head = [self.const(np.array([-1], np.int64), "shape"), self.lead_count(a.second)]
            else:
                head = [self.const(np.array([-1] if op == "merge_lead" else [-1, int(a.second)], np.int64), "shape")]
            return self.node("Reshape", [x, self.node("Concat", [*head, shape], {"axis": 0})], like=x)
        fused = self.target.op_for(op)
        if fused is not None:
            return WRITERS[fused.writer](n, self, fused)
        raise ValueError(f"cannot emit {op} for target {self.target.name}")
