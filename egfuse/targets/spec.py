"""What a target is, as data: the fused ops it can write and what running them costs.

A target module holds one :class:`TargetSpec` and nothing else; :mod:`egfuse.targets` registers it. Raising
reads the spec (which writer writes which constructor, which opset each op needs), extraction reads its costs
(:mod:`egfuse.egraph.cost`), and nothing outside a target's module asks for a target by name. A new target is a new
module and one registry line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

STANDARD_ATTENTION_OPSET = 23
"""The default-domain opset that defines the standard ``Attention`` and ``RotaryEmbedding`` ops."""

ATTENTION = frozenset({"attend", "attend_z", "mha", "gqa", "mha_kv4", "packed_attention", "mha_standard"})
"""The language's attention constructors: one attention each, however a target writes it."""

LAYER_OPS = frozenset({"layer_norm", "skip_layer_norm", "rms_norm", "skip_rms_norm", "gelu", "bias_gelu"})
RESIDUAL_NORMS = frozenset({"skip_layer_norm", "skip_rms_norm"})
"""Norms that add the residual themselves (and return the sum)."""
"""The language's norm and activation constructors (:mod:`egfuse.rules.norms`, :mod:`egfuse.rules.gelu`)."""

ROTARY_OPS = frozenset({"rotary"})
"""The language's rotary-embedding constructor (:mod:`egfuse.rules.rotary`)."""

FUSED = ATTENTION | LAYER_OPS | ROTARY_OPS
"""Every constructor a target writes as a fused op."""

WRITERS = frozenset({"standard", "multi_head", "packed_qkv", "single_head", "norm", "gelu", "rotary"})
"""How raising can write a fused constructor (:mod:`egfuse.writing.writers`):

* ``standard``    — the standard ``Attention`` op (opset 23), 4D or 3D inputs, grouped K/V heads native
* ``multi_head``  — ``com.microsoft.MultiHeadAttention`` on the (B, S, N·H) query
* ``packed_qkv``  — ``com.microsoft.Attention``: the three projections' weights concatenated into the op
* ``single_head`` — plain rank-3 ops, one attention per head (SHA): what NPU toolchains compile well
* ``norm``        — the standard ``LayerNormalization`` (opset 17) or ``RMSNormalization`` (23), last axis
* ``gelu``        — one activation op on one input (``Gelu``, standard or ``com.microsoft``, ``FastGelu``), or
  ``BiasGelu`` with its bias
* ``rotary``      — the standard ``RotaryEmbedding`` (opset 23), 4D or on the merged heads (3D)
"""


@dataclass(frozen=True)
class FusedOp:
    """One fused constructor as a target writes it."""

    constructor: str
    """The e-graph constructor (:data:`FUSED`) this op computes."""
    op: str
    """The ONNX op type written (the report's name for it; ``single_head`` writes plain ops)."""
    writer: str
    """Which writer of :mod:`egfuse.writing.writers` writes it (:data:`WRITERS`)."""
    domain: str = ""
    opset: int = 1
    """The version of ``domain`` the op needs imported."""
    softcap: bool = True
    """Takes a soft-capped score (MultiHeadAttention has no softcap attribute)."""
    positive_scale: bool = False
    """Refuses a scale ≤ 0 (onnxruntime's standard op rejects it)."""
    zero_scale_is_default: bool = False
    """Reads a scale of 0 as "the default 1/√H" (the com.microsoft ops): a real scale of 0 cannot be written."""
    dtypes: frozenset[str] = frozenset({"float32", "float16"})
    """The element types onnxruntime has a kernel of this op for (numpy names; measured on its CPU provider)."""
    efficiency: float = 1.0
    """How much of the target's peak this op reaches (the cost model divides its work by it; calibrated)."""
    overhead_us: float = 0.0
    """Fixed time per call on top of the work (launch, layout copies inside the kernel), microseconds."""
    per_dtype: tuple[tuple[str, float, float], ...] = ()
    """(element type, efficiency, overhead_us) where a provider runs this op at another speed in that type: a
    kernel without a fast path for bfloat16 is slower than in float16 at the same bytes and FLOPs (a profile's
    ``"form@dtype"`` entries, measured; an entry also means the op ran in that type)."""
    mask_note: str = ""
    """What the report says when this op was written with a mask (how the kernel reads one differently)."""
    broadcasts_batch: bool = False
    """Takes K/V with a batch of 1 for a query with more (a relative-position table read as keys). Fused
    kernels check the batches are equal; per-head MatMuls broadcast."""
    flops_per_element: float | None = None
    """Set for an op that reads and writes one tensor's elements (a norm, an activation, a rotation): its FLOPs an
    element, what the cost model prices it by. None: an attention op, priced by its products."""
    attributes: tuple[tuple[str, str | int | float], ...] = ()
    """Attributes written on the op beside those its writer derives (``approximate="tanh"``)."""
    absorbs_cache: bool = True
    """Takes a KV cache's ``Concat(past, new)`` as past_key/past_value in and present outputs (where its writer
    can): onnxruntime's CUDA MultiHeadAttention refuses a cache beside (B, N, T, H) keys ("shall be empty for
    cross attention"), which its CPU kernel runs."""

    @property
    def label(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op

    def speed(self, dtypes: frozenset[str] | set[str]) -> tuple[float, float]:
        """(efficiency, overhead_us) for outputs of ``dtypes``: the measured entry of their one type, if any."""
        for dtype, efficiency, overhead in self.per_dtype:
            if set(dtypes) == {dtype}:
                return efficiency, overhead
        return self.efficiency, self.overhead_us


LAYER_NORM = FusedOp("layer_norm", "LayerNormalization", "norm", opset=17, flops_per_element=8.0)
RMS_NORM = FusedOp("rms_norm", "RMSNormalization", "norm", opset=STANDARD_ATTENTION_OPSET, flops_per_element=6.0)
NORM_OPS = (LAYER_NORM, RMS_NORM)
"""Every target writes norms as the standard ops: onnxruntime has kernels for both, and NPU toolchains lower
them themselves. FLOPs an element: a norm's mean, centring, square, variance, scale and shift."""
SKIP_LAYER_NORM = FusedOp("skip_layer_norm", "SkipLayerNormalization", "norm", domain="com.microsoft", opset=1,
                          flops_per_element=9.0)  # fmt: skip
SKIP_RMS_NORM = FusedOp("skip_rms_norm", "SkipSimplifiedLayerNormalization", "norm", domain="com.microsoft", opset=1,
                        flops_per_element=7.0)  # fmt: skip
"""onnxruntime's residual sum and layer norm in one kernel."""
GELU = FusedOp("gelu", "Gelu", "gelu", opset=20, flops_per_element=12.0)
GELU_CONTRIB = FusedOp("gelu", "Gelu", "gelu", domain="com.microsoft", opset=1, flops_per_element=12.0)
BIAS_GELU = FusedOp("bias_gelu", "BiasGelu", "gelu", domain="com.microsoft", opset=1, flops_per_element=13.0)
"""onnxruntime's own Gelu runs on a model at any opset (the standard one needs opset 20); its BiasGelu adds a
projection's bias in the same kernel. FLOPs an element: erf's polynomial, the products."""
ROTARY = FusedOp("rotary", "RotaryEmbedding", "rotary", opset=STANDARD_ATTENTION_OPSET, flops_per_element=3.0)
"""Took 0.35-0.78× the time of the rotate-half subgraph on onnxruntime's CPU and 0.54-0.84× of
``com.microsoft.RotaryEmbedding``'s (experiments/bench_rotary.py). FLOPs an element: two products and a sum."""


@dataclass(frozen=True)
class CostParams:
    """A roofline: an op takes max(FLOPs / throughput, bytes / bandwidth) / efficiency + overhead.

    Primitive ops take the same form with a per-op-kind efficiency (``primitive_efficiency``; views cost nothing
    at run time). Numbers are for the machine the target's profile was measured on (``egfuse calibrate``)."""

    gflops: float = 50.0
    """Sustained matrix-multiply throughput, GFLOP/s."""
    gbytes: float = 10.0
    """Sustained memory bandwidth, GB/s."""
    op_overhead_us: float = 5.0
    """Fixed cost of one node (dispatch, allocation), microseconds."""
    primitive_efficiency: dict[str, float] = field(default_factory=dict)
    """Per primitive constructor (``matmul``, ``softmax``, ``transpose4`` for a rank-4 Transpose …): the share of
    the roofline it reaches; a constructor absent here reaches 1.0."""
    free_views: bool = False
    """Reshapes cost nothing (a compiler folds them into its layouts); a runtime dispatches each as a node."""
    primitive_overhead_us: dict[str, float] = field(default_factory=dict)
    """Per primitive constructor, a fixed cost on top of the node's (a layout change an NPU does in software);
    the key ``rank4`` applies to every primitive op whose operands are rank 4."""


@dataclass(frozen=True)
class TargetSpec:
    """A hardware target: what it can write, what that costs, and what it needs of the model."""

    name: str
    description: str
    """One line for ``egfuse targets``."""
    ops: tuple[FusedOp, ...]
    costs: CostParams = field(default_factory=CostParams)
    rule_families: tuple[str, ...] = ()
    """Rule families beyond the core (:mod:`egfuse.rules`) that build this target's forms (``ort``: packing)."""
    shape_binding: tuple[tuple[str, int], ...] = ()
    """The sizes to optimize for (``--shape seq=512,past=1024``): symbol (or word in it) → size; unbound symbolic
    dims take typical sizes (:mod:`egfuse.egraph.shapes`)."""
    keep_unfused: bool = False
    """Extraction may keep a region's own ops where they are predicted cheaper than every fused form (npu: a
    block already written as rank-3 single-head attention). Off: any fused form the target can write wins,
    and the costs choose among them."""
    requires_standard_opset: bool = False
    """The model is converted to opset 23 before fusing (every op it writes may need it)."""
    no_rotary: str | None = None
    """Why this target writes no ``RotaryEmbedding`` for a recognised rotation (None: it writes the op its
    ``ops`` hold for ``rotary``, if any)."""
    below_opset_ops: tuple[FusedOp, ...] = ()
    """Forms offered only where the standard ops drop out (:meth:`below_opset`): slower in whole models than
    the standard op that replaces them, faster than what is left without it."""

    def op_for(self, constructor: str) -> FusedOp | None:
        if constructor in ROTARY_OPS and self.no_rotary is not None:
            return None
        return next((op for op in self.ops if op.constructor == constructor), None)

    def for_shapes(self, binding: dict[str, int] | None) -> TargetSpec:
        """The target optimizing for ``binding``'s sizes."""
        return replace(self, shape_binding=tuple(sorted((binding or {}).items())))

    def with_profile(self, profile: dict) -> TargetSpec:
        """The target with a calibration profile's fitted parameters (``egfuse calibrate``); ops the profile
        does not name keep theirs."""
        if profile.get("target") != self.name:
            raise ValueError(f"the profile is for target {profile.get('target')!r}, not {self.name!r}")
        costs = CostParams(**profile["costs"]) if "costs" in profile else self.costs
        fitted = {k: v for k, v in profile.get("ops", {}).items() if "@" not in k}
        typed: dict[str, list[tuple[str, float, float]]] = {}  # "mha@bfloat16": the op measured in that type
        for key, values in profile.get("ops", {}).items():
            if "@" in key:
                form, dtype = key.split("@", 1)
                typed.setdefault(form, []).append((dtype, float(values["efficiency"]), float(values["overhead_us"])))
        for op in self.ops:  # a form the profile did not time runs on the same kernel as one it did
            for table in (fitted, typed):
                if op.constructor not in table:
                    twin = next((o for o in self.ops if o.label == op.label and o.constructor in table), None)
                    if twin is not None:
                        table[op.constructor] = table[twin.constructor]

        def fit(op: FusedOp) -> FusedOp:
            if op.constructor in fitted:
                op = replace(op, **{k: float(v) for k, v in fitted[op.constructor].items()})
            measured = tuple(sorted(typed.get(op.constructor, ())))
            if measured:
                op = replace(op, per_dtype=measured, dtypes=op.dtypes | {d for d, _, _ in measured})
            return op

        ops, fallbacks = tuple(fit(op) for op in self.ops), tuple(fit(op) for op in self.below_opset_ops)
        keep_unfused = bool(profile.get("keep_unfused", self.keep_unfused))
        return replace(self, costs=costs, ops=ops, below_opset_ops=fallbacks, keep_unfused=keep_unfused)

    def below_opset(self, version: int) -> TargetSpec:
        """The target without the default-domain ops that need a newer opset than ``version`` (a model onnx's
        converter cannot raise keeps the contrib ops only)."""
        ops = tuple(op for op in (*self.ops, *self.below_opset_ops) if op.domain != "" or op.opset <= version)
        no_rotary = self.no_rotary
        if no_rotary is None and version < STANDARD_ATTENTION_OPSET:
            no_rotary = "the model cannot be raised to opset 23, which defines RotaryEmbedding"
        return replace(self, ops=ops, no_rotary=no_rotary)
