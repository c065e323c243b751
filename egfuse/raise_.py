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
from egfuse.session import EClass, ENode
from egfuse.shapes import Shape, static
from egfuse.targets.spec import FUSED, TargetSpec
from egfuse.writers import WRITERS

_LOWEST = frozenset(float(np.finfo(t).min) for t in (np.float16, np.float32, np.float64))
"""finfo.min of each float type, as the f64 a fill is kept as in the e-graph."""

_SIMPLE = {"matmul": "MatMul", "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "where": "Where",
           "isnan": "IsNaN", "sqrt": "Sqrt", "tanh": "Tanh", "reshape": "Reshape"}  # fmt: skip


class NodeBuilder:
    """Names and collects the nodes a rewrite writes (the caller inserts ``new_nodes`` where they belong)."""

    def __init__(self, graph: ir.Graph, prefix: str) -> None:
        self.graph = graph
        self.prefix = prefix
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
        node = ir.Node(
            domain, op, inputs, attributes=ir.convenience.convert_attributes(attrs or {}), name=name, num_outputs=count
        )
        for i, out in enumerate(node.outputs):
            out.name = name if i == 0 else f"{name}/{i}"
            self.created.add(out)
        if like is not None and like.dtype is not None:
            node.outputs[0].dtype = like.dtype
        self.new_nodes.append(node)
        return list(node.outputs)

    def const(self, array: np.ndarray, hint: str = "const") -> ir.Value:
        out = self.node("Constant", [], {"value": ir.tensor(array, name=self._name(hint))})
        # Typed, so what is computed from it is too: a mask of unknown dtype was passed to the standard op
        # without :meth:`Emitter.finite_mask` (a select mask plus a padding term, GPT-2/GPT-Neo eager).
        out.dtype, out.shape = ir.DataType.from_numpy(np.asarray(array).dtype), ir.Shape(np.asarray(array).shape)
        return out

    def initializer(self, array: np.ndarray, hint: str) -> ir.Value:
        value = ir.Value(name=self._name(hint), const_value=ir.tensor(array))
        value.dtype = ir.DataType.from_numpy(array.dtype)
        value.shape = ir.Shape(array.shape)
        self.graph.register_initializer(value)
        return value

    def take_nodes(self) -> list[ir.Node]:
        """The nodes written since the last call, handed over for insertion."""
        nodes, self.new_nodes = self.new_nodes, []
        return nodes


class Emitter(NodeBuilder):
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
        super().__init__(graph, prefix)
        self.shapes = shapes or {}
        self.opset = opset
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
        self.exact_fills: set[EClass] = set()
        """Select-mask fills (``full_like``) written as the graph's own number, not respelled by
        :meth:`Target.mask_fill`: the mask holds other terms (see :meth:`mark_exact_fills`)."""

    def operands(
        self, q: EClass, k: EClass, v: EClass, bias: EClass, q_axis: int, k_axis: int, cache_allowed: bool
    ) -> tuple[list[ir.Value], ir.Value | None, CacheConcat | None]:
        """Q, K, V and the broadcast mask of a fused op — with K/V the new entries and the cache returned when
        they come from a KV-cache Concat the op can absorb (see :mod:`egfuse.kv_cache`)."""
        query, key, value = self.value(q), self.value(k), self.value(v)
        cache = None
        if cache_allowed and key not in self.created and value not in self.created:
            cache = find_cache(key, value, self.facts)
        if cache is not None:
            # Checked before the mask's broadcast is emitted: it reads only the mask, Q and the cache's inputs.
            mask_source = None if self.choice[bias].node.op == "no_bias" else self.value(bias)
            reads = [query, mask_source, cache.past_key, cache.new_key, cache.past_value, cache.new_value]
            if not depends_on(reads, {cache.present_key, cache.present_value}):
                self.cache_note = "Concat(past, new) absorbed: past_key/past_value in, present outputs from the op"
                length = (self.facts.shape(cache.present_key) or (None,) * 4)[SEQUENCE_AXIS]
                mask = self.bias(bias, query, cache.new_key, q_axis, k_axis, (self.key_length(cache), length))
                return [query, cache.new_key, cache.new_value], mask, cache
            self.cache_note = "Concat(past, new) kept outside: the op's inputs are computed from its output"
        return [query, key, value], self.bias(bias, query, key, q_axis, k_axis), None

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
        lengths = [self.node("Shape", [v], {"start": 2, "end": 3}) for v in (cache.past_key, cache.new_key)]
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
        if cid in self.ranks:
            return int(self.ranks[cid])
        if self.shapes.get(cid) is not None:
            return len(self.shapes[cid])
        if emitted.shape is not None:
            return len(emitted.shape)
        derived = self._derived_rank(cid, depth=0)
        if derived is None:
            raise ValueError(f"rank of {emitted.name} unknown")
        return derived

    def _derived_rank(self, cid: EClass, depth: int) -> int | None:
        """The rank of a term the rules built, from its chosen constructor."""
        if cid in self.ranks:
            return int(self.ranks[cid])
        node = self.choice[cid].node
        if depth > 16:
            return None
        if node.op in ("mha", "gqa", "mha_kv4", "packed_attention"):
            return 3
        if node.op in ("attend", "attend_z"):
            return 4
        if node.op == "transpose":
            return len(view(node).perm.split(","))
        if node.op in ("add", "sub", "mul", "div", "where", "maximum"):  # broadcasting: the widest operand's
            ranks = [self._derived_rank(c, depth + 1) for c in node.children]
            return None if None in ranks else max(ranks)
        child = self._derived_rank(node.children[0], depth + 1) if node.children else None
        if child is None:
            return None
        return child + {"split_heads": 1, "split_lead": 1, "merge_heads": -1, "merge_lead": -1}.get(node.op, 0)

    def bias(
        self,
        cid: EClass,
        query: ir.Value,
        key: ir.Value,
        q_axis: int,
        k_axis: int,
        key_length: tuple[ir.Value, Dim | None] | None = None,
    ) -> ir.Value | None:
        """The additive mask, broadcast to (…, S, T): the kernels index it by query row without broadcasting.
        ``key_length`` overrides T (the value to read it from, and its dim where known; read from ``key``'s
        shape otherwise). The mask goes as it is only where its last two dims are provably S and T: a mask
        (B, 1, 1, T) of a decode step traced at one token keeps the name ``sequence`` for its query axis while
        the op's query axis is the grouped heads (transformers' GQA written as Q (B, N_kv, N/N_kv, H))."""
        if self.choice[cid].node.op == "no_bias":
            return None
        self.mark_exact_fills(cid)
        mask = self.value(cid)
        known = self.facts.shape(self.leaf_value(cid))  # None for a term the rules built
        s_dim = _axis_dim(self.facts.shape(query), q_axis)
        t_dim = key_length[1] if key_length is not None else _axis_dim(self.facts.shape(key), k_axis)
        if known is not None and len(known) == 4 and None not in (s_dim, t_dim) and known[2:] == (s_dim, t_dim):
            return mask
        ones = self.const(np.array([1, 1], np.int64), "ones")
        s = self.node("Shape", [query], {"start": q_axis, "end": q_axis + 1})
        t = key_length[0] if key_length is not None else self.node("Shape", [key], {"start": k_axis, "end": k_axis + 1})
        target = self.node("Concat", [ones, s, t], {"axis": 0})
        return self.node("Expand", [mask, target], like=mask)

    def mark_exact_fills(self, cid: EClass) -> None:
        """Note the select fills of the mask ``cid`` to write exactly: all of them, unless the mask is made of
        fills alone.

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
                stack.extend(node.children[1:])
            elif node.op in ("add", "sub", "mul", "div"):
                stack.extend(node.children)
            else:
                fills_only = False
        if not fills_only:
            self.exact_fills.update(fills)

    def finite_mask(self, bias: EClass, mask: ir.Value | None) -> ir.Value | None:
        """``mask`` with its entries equal to finfo.min moved one ulp up, for onnxruntime's standard
        ``Attention``: it reads such an entry as −inf (a row masked entirely that way gives 0), where the graph
        adds it to a score and gets finfo.min, finite and tied with the row's other masked entries (a
        left-padded query row under a causal mask is uniform over them). Masks that cannot hold finfo.min —
        select fills this emitter wrote (:meth:`Target.mask_fill`), constants without it — are left as they are."""
        if mask is None or mask.dtype is None or not self._may_hold_lowest(bias):
            return mask
        dtype = np.dtype(mask.dtype.numpy())
        if not np.issubdtype(dtype, np.floating):
            return mask
        lowest = np.finfo(dtype).min
        is_lowest = self.node("Equal", [mask, self.const(np.array(lowest, dtype), "lowest")])
        above = self.const(np.array(np.nextafter(lowest, dtype.type(0)), dtype), "fill")
        return self.node("Where", [is_lowest, above, mask], like=mask)

    def _may_hold_lowest(self, cid: EClass) -> bool:
        node = self.choice[cid].node
        if node.op == "full_like":  # written exactly when summed (a lowest fill moved otherwise)
            return cid in self.exact_fills and float(view(node).fill) in _LOWEST
        if node.op == "no_bias":
            return False
        if node.op == "where":  # the condition is not a mask value
            return any(self._may_hold_lowest(c) for c in node.children[1:])
        if node.op == "add":
            return any(self._may_hold_lowest(c) for c in node.children)
        leaf = self.leaf_value(cid)
        array = self.facts.const(leaf) if leaf is not None else None
        if array is not None and np.issubdtype(array.dtype, np.floating):
            return bool((array == np.finfo(array.dtype).min).any())
        return True

    # --- helpers for writers --------------------------------------------------------------------------------
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
            if original is not None and not self._has_fused(cid):
                self.memo[cid] = original  # unchanged by fusion: reuse the graph's own value, emit nothing
            else:
                self.memo[cid] = self._emit(self.choice[cid].node, cid)
        return self.memo[cid]

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
            return self.node(_SIMPLE[op], inputs, like=inputs[1] if op == "where" else inputs[0])
        if op == "full_like":
            like = self.value(a.like)
            dtype = np.dtype(like.dtype.numpy() if like.dtype is not None else np.float32)
            fill = float(a.fill) if cid in self.exact_fills else mask_fill(float(a.fill), dtype)
            return self.const(np.array(fill, dtype=dtype), "fill")
        if op == "zero_bias":
            weight = self.constant_array(a.weight)
            return self.const(np.zeros(weight.shape[-1], weight.dtype), "zero_bias")
        if op == "cast":
            return self.node("Cast", [self.value(a.a)], {"to": int(a.to)})
        if op == "softmax":
            return self.node("Softmax", [self.value(a.a)], {"axis": -1}, like=self.value(a.a))
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
        if op in ("merge_lead", "split_lead"):
            x = self.value(a.a)
            shape = self.node("Shape", [x], {"start": 2 if op == "merge_lead" else 1})
            head = [-1] if op == "merge_lead" else [-1, int(a.second)]
            spec = self.node("Concat", [self.const(np.array(head, np.int64), "shape"), shape], {"axis": 0})
            return self.node("Reshape", [x, spec], like=x)
        fused = self.target.op_for(op)
        if fused is not None:
            return WRITERS[fused.writer](n, self, fused)
        raise ValueError(f"cannot emit {op} for target {self.target.name}")


def mask_fill(fill: float, dtype: np.dtype) -> float:
    """The number to write for a select mask's fill so every kernel computes what the graph did.

    onnxruntime's standard ``Attention`` reads a mask entry equal to ``lowest`` (finfo.min) as −inf and gives 0
    for a query row masked entirely that way, where the primitive ops give the mean of V. One ulp above
    ``lowest`` means the same to the graph's algebra (added to any score it still rounds to the fill itself, so a
    fully masked row stays uniform) and to every kernel, so every target gets that — for a mask made of fills
    alone: next to another term that may hold ``lowest`` (a padding mask) the moved fill would break their tie,
    so the emitter writes the fill as it is there (:meth:`Emitter.mark_exact_fills`) and the standard op gets
    the whole mask moved instead (:meth:`Emitter.finite_mask`)."""
    lowest = np.finfo(dtype).min if np.issubdtype(dtype, np.floating) else None
    if lowest is not None and fill == float(lowest):
        return float(np.nextafter(lowest, dtype.type(0)))
    return fill


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


def _axis_dim(shape: tuple[Dim | None, ...] | None, axis: int) -> Dim | None:
    """The dim at ``axis`` of a known shape (``None`` where the shape, or that dim, is unknown)."""
    return None if shape is None or not -len(shape) <= axis < len(shape) else shape[axis]
