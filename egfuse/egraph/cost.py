"""What an e-node costs on a target: a roofline over its shapes, in microseconds.

Every e-node's time is ``max(FLOPs / throughput, bytes / bandwidth) / efficiency + overhead``, its shapes
read from the e-graph (:mod:`egfuse.egraph.shapes`) with symbolic dims bound to typical or user-given sizes
(``--shape seq=512,past=1024``). So the same e-graph extracts differently for a decode step (T = 1, where a
fused op's fixed cost dominates) and a long prefill (S = 512, where bytes and FLOPs do), and a target's
parameters (:class:`egfuse.targets.spec.CostParams`, per-op efficiencies) are numbers a calibration fits
(``egfuse calibrate``), not constants written down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from egfuse.analysis.dims import Dim
from egfuse.egraph.enodes import view
from egfuse.egraph.session import EClass, ENode
from egfuse.egraph.shapes import Shape, bound
from egfuse.targets.spec import RESIDUAL_NORMS, FusedOp, TargetSpec

HALF_TYPES = frozenset({"float16", "bfloat16"})

ELEMENT_BYTES = 4
"""float32; a half-precision model's costs scale alike for every form, so the choice does not change."""

_VIEWS = frozenset({"split_heads", "merge_heads", "merge_lead", "split_lead", "reshape", "unsqueeze", "squeeze",
                    "group_heads", "ungroup_heads"})  # fmt: skip
"""Reshapes: no data moves, one node dispatched."""
_LEAVES = {"value": 0.0, "no_bias": 0.0, "full_like": 0.05, "zero_bias": 0.05, "unit_scale": 0.05}
_NODES = {"nan_to_zero": 2, "repeat_heads": 7}
"""Constructors that raise to more than one node."""
_FLOPS_PER_ELEMENT = {"softmax": 5.0, "tanh": 4.0, "sqrt": 2.0, "pow": 2.0, "erf": 10.0, "cos": 10.0, "sin": 10.0}


@dataclass(frozen=True)
class Work:
    """What one e-node computes: FLOPs, bytes read and written, nodes dispatched."""

    flops: float
    bytes: float
    nodes: int = 1


class CostModel:
    """A target's costs over one e-graph: the extractor asks :meth:`cost` for every e-node."""

    def __init__(
        self,
        spec: TargetSpec,
        shapes: Mapping[EClass, Shape],
        value_types: frozenset[str] = frozenset(),
        float32: frozenset[EClass] = frozenset(),
    ) -> None:
        self.spec = spec
        self.value_types = value_types
        self.float32 = float32
        """E-classes holding float32 values (:mod:`egfuse.egraph.wide_classes`): a half-precision region's bias there
        goes only to an op whose mask type is free of Q's."""
        """The element types of the attention outputs being fused (numpy names): an op without a kernel for
        one of them is refused."""
        self.binding = dict(spec.shape_binding)
        self._shapes = shapes
        self._bound: dict[EClass, tuple[int, ...] | None] = {}

    def dims(self, cid: EClass) -> tuple[int, ...] | None:
        if cid not in self._bound:
            self._bound[cid] = bound(self._shapes.get(cid), self.binding)
        return self._bound[cid]

    def cost(self, node: ENode) -> float | None:
        """What extraction minimises: :meth:`time`, except that a target which fuses whenever it can
        (``TargetSpec.keep_unfused`` off) cannot write a Softmax, so the costs choose among the fused forms and
        never trade a fusion for a predicted microsecond. (A region with no fused form, or a softmax whose
        probabilities are read elsewhere, then has no extraction for that output and keeps its own nodes.)"""
        if node.op == "softmax" and not self.spec.keep_unfused:
            return None
        return self.time(node)

    def time(self, node: ENode) -> float | None:
        """Predicted microseconds, or None where the target cannot run ``node`` (an op it lacks, a form it
        refuses)."""
        if node.op in _LEAVES:
            return _LEAVES[node.op]
        fused = self.spec.op_for(node.op)
        if fused is not None:
            return self._fused_cost(node, fused)
        work = self._primitive_work(node)
        if work is None:
            return None
        params = self.spec.costs
        kind = self._kind(node)
        efficiency = params.primitive_efficiency.get(kind, 1.0)
        extra = params.primitive_overhead_us.get(kind, 0.0)
        if work.nodes and params.primitive_overhead_us.get("rank4") and self._rank4(node):
            extra += params.primitive_overhead_us["rank4"]
        return self._roofline(work, efficiency) + work.nodes * params.op_overhead_us + extra

    def roofline(self, node: ENode) -> float | None:
        """A fused e-node's work at full efficiency, µs (what calibration fits the op's efficiency against)."""
        fused = self.spec.op_for(node.op)
        work = self._fused_work(node, fused) if fused is not None else None
        return None if work is None else self._roofline(work, 1.0)

    def explain(self, node: ENode) -> str:
        """One line: the work the cost came from (for the report's candidates)."""
        fused = self.spec.op_for(node.op)
        work = self._fused_work(node, fused) if fused is not None else self._primitive_work(node)
        if work is None:
            return "not runnable"
        return f"{work.flops / 1e6:.2f} MFLOP, {work.bytes / 1e6:.2f} MB, {work.nodes} node(s)"

    # --- fused ops -----------------------------------------------------------------------------------------
    def _fused_cost(self, node: ENode, op: FusedOp) -> float | None:
        if not self.value_types <= op.dtypes:
            return None
        if op.flops_per_element is None and not self._takes(node, op):
            return None
        work = self._fused_work(node, op)
        if work is None:
            return None
        efficiency, overhead = op.speed(self.value_types)
        return self._roofline(work, efficiency) + overhead + work.nodes * self.spec.costs.op_overhead_us

    def _takes(self, node: ENode, op: FusedOp) -> bool:
        """What an attention op refuses: a scale it cannot express, a soft cap it lacks, a broadcast batch."""
        packed, a = node.op == "packed_attention", view(node)
        if (op.positive_scale and float(a.scale) <= 0) or (op.zero_scale_is_default and float(a.scale) == 0):
            return False
        if not op.softcap and not packed and float(a.cap) != 0.0:
            return False
        if node.op == "mha_kv4" and self._head_sizes_differ(a.k, a.v):
            return False
        if op.domain and a.bias in self.float32 and self.value_types & HALF_TYPES:
            return False  # a contrib op's bias has Q's type: a float32 mask would be rounded to it
        return packed or op.broadcasts_batch or not self._batch_broadcast(node)

    def _head_sizes_differ(self, k: EClass, v: EClass) -> bool:
        """MultiHeadAttention takes (B, N, T, H) keys and values of one shape: LeViT's keys are narrower than its
        values (onnxruntime refuses the op at run time: "shall have same shape")."""
        keys, values = self._shapes.get(k), self._shapes.get(v)
        if not keys or not values or keys[-1] is None or values[-1] is None:
            return False
        return keys[-1].static is not None and values[-1].static is not None and keys[-1] != values[-1]

    def _batch_broadcast(self, node: ENode) -> bool:
        """K or V of batch 1 (with Q's rank, or 4D beside a 3D query) where the query's batch may be more:
        broadcasting a fused kernel refuses."""
        a = view(node)
        q, k, v = (self._shapes.get(c) for c in (a.q, a.k, a.v))
        if not q or q[0] == Dim(1):
            return False
        return any(x and x[0] == Dim(1) and (len(x) == len(q) or (len(x), len(q)) == (4, 3)) for x in (k, v))

    def _fused_work(self, node: ENode, op: FusedOp) -> Work | None:
        """FLOPs of ``Q Kᵀ`` and ``P V`` (plus the projections packed Attention absorbs), bytes of its inputs
        and output — never the (S, T) scores a fused op keeps in registers, unless it is written head by head.
        A norm or an activation reads its input and writes its output once, with a few FLOPs an element (the
        op's ``flops_per_element``)."""
        if op.flops_per_element is not None:
            x = self.dims(view(node).x)  # γ and β: one value per feature
            if x is None:
                return None
            flops, moved = op.flops_per_element * math.prod(x), 2 * math.prod(x) + 2 * x[-1]
            if node.op in RESIDUAL_NORMS:  # the skip read, the sum written
                moved += 2 * math.prod(x)
            # A rotation of (B, S, N, H) is the op's 3D form between two Reshapes.
            nodes = 3 if node.op == "rotary" and int(view(node).heads_axis) != 1 else 1
            return Work(flops, moved * ELEMENT_BYTES, nodes)
        if node.op == "packed_attention":
            a = view(node)
            x, wq, wk, wv = (self.dims(c) for c in (a.x, a.wq, a.wk, a.wv))
            if None in (x, wq, wk, wv) or len(x) < 2:
                return None
            d, width, rows, seq = x[-1], wq[-1] + wk[-1] + wv[-1], math.prod(x[:-1]), x[-2]
            flops = 2.0 * rows * d * width + 2.0 * rows * seq * (wq[-1] + wv[-1])
            moved = math.prod(x) + d * width + rows * wv[-1]
            return Work(flops, moved * ELEMENT_BYTES)
        a = view(node)
        q, k, v = (self.dims(c) for c in (a.q, a.k, a.v))
        bias = self.dims(a.bias)
        if None in (q, k, v):
            return None
        heads = int(a.heads) if node.op in ("mha", "gqa", "mha_kv4", "mha_standard") else (q[1] if len(q) == 4 else 1)
        if len(q) == 4:
            batch, s, h = q[0], q[2], q[3]
        else:
            batch, s, h = math.prod(q[:-2]) if len(q) > 2 else 1, q[-2], q[-1] // max(heads, 1)
        t = k[-2]
        hv = v[-1] if len(v) == 4 else v[-1] // max(int(a.kv_heads) if node.op == "gqa" else heads, 1)
        flops = 2.0 * batch * heads * s * t * (h + hv)
        moved = math.prod(q) + math.prod(k) + math.prod(v) + batch * heads * s * hv
        if bias is not None:  # broadcast to the scores at most
            moved += min(math.prod(bias), batch * heads * s * t)
        nodes = 1
        if op.writer == "single_head":  # the (S, T) scores go through memory, head by head
            moved += 3 * batch * heads * s * t
            nodes = 4 + 7 * heads
        return Work(flops, moved * ELEMENT_BYTES, nodes)

    # --- primitive ops -------------------------------------------------------------------------------------
    def _kind(self, node: ENode) -> str:
        if node.op == "transpose":
            return f"transpose{len(view(node).perm.split(','))}"
        return node.op

    def _rank4(self, node: ENode) -> bool:
        return any(len(self.dims(c) or ()) >= 4 for c in node.children)

    def _primitive_work(self, node: ENode) -> Work | None:
        op = node.op
        if op in _VIEWS:
            return Work(0.0, 0.0, nodes=0 if self.spec.costs.free_views else 1)
        ins = [self.dims(c) or (1,) for c in node.children]  # unknown or scalar: one element
        sizes = [math.prod(map(float, i)) for i in ins]  # float: absurd dims give inf, not an overflow
        if op == "matmul":
            a, b = ins
            lead = max(math.prod(a[:-2]), math.prod(b[:-2]))
            out = lead * (a[-2] if len(a) > 1 else 1) * b[-1]
            return Work(2.0 * out * a[-1], (sizes[0] + sizes[1] + out) * ELEMENT_BYTES)
        if op in ("concat", "part", "cols_before", "cols_from", "strided", "rows"):  # copies
            out = sum(sizes) if op == "concat" else sizes[0] / 2
            axis = int(view(node).axis) if op == "part" else 0
            if -len(ins[0]) <= axis < 0:
                out = sizes[0] * int(view(node).size) / max(ins[0][axis], 1)
            return Work(0.0, 2.0 * out * ELEMENT_BYTES)
        if op in ("add", "sub", "mul", "div", "where", "maximum", "isnan", "sqrt", "tanh", "cast", "softmax",
                  "nan_to_zero", "transpose", "repeat_heads", "pow", "reciprocal", "reduce_mean", "erf", "neg", "cos",
                  "sin", "tile_lead", "row_max", "zero_row", "zero_col", "sink_col"):  # fmt: skip
            out = max(sizes) if sizes else 1
            if op == "repeat_heads":
                out *= int(view(node).times)
            return Work(_FLOPS_PER_ELEMENT.get(op, 1.0) * out, (sum(sizes) + out) * ELEMENT_BYTES, _NODES.get(op, 1))
        return None  # canonical forms (scores, probs, softcap, interleave) are never written

    def _roofline(self, work: Work, efficiency: float) -> float:
        params = self.spec.costs
        compute = work.flops / (params.gflops * 1e3)
        memory = work.bytes / (params.gbytes * 1e3)
        return max(compute, memory) / max(efficiency, 1e-6)


class WithoutForms:
    """A cost model that cannot write some fused forms (those that failed validation for one region)."""

    def __init__(self, model: CostModel, forms: set[str]) -> None:
        self.model = model
        self.forms = forms

    def cost(self, node: ENode) -> float | None:
        return None if node.op in self.forms else self.model.cost(node)
