"""Build attention subgraphs in any of the spellings exporters use — for tests, fuzzing and bug reports.

``attention_model(Variant(...))`` writes one self-attention block (projections → heads → scores → mask →
softmax → @V → merged heads) as plain ONNX ops, with each spelling choice independent of the others. The
hypothesis strategy ``variants()`` draws those choices at random, so users can fuzz their own rules the
way egfuse's property tests do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SCALES = ("qk_mul", "qk_div", "q_mul", "k_div", "split_sqrt", "runtime", "custom", "none")
K_LAYOUTS = ("transpose_0132", "transpose_0231", "dynamo_3d")
MASKS = ("none", "additive", "additive_first", "additive_before_scale", "where_neginf", "where_finfo",
         "where_reversed", "padding_int")  # fmt: skip
CAUSAL = ("none", "trilu", "range_greater")
DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class Variant:
    """One spelling of self-attention. Defaults are the classic BERT export."""

    scale: str = "qk_div"
    k_layout: str = "transpose_0231"
    mask: str = "additive"
    guard: bool = False  # Where(IsNaN(p), 0, p) after the softmax
    commuted: bool = False  # swap the operands of every commutative Mul/Add
    proj_bias: bool = True
    heads: int = 2
    head_dim: int = 8
    symbolic: bool = True  # batch and sequence as named dims
    causal: str = "none"  # a causal term on top of the mask: Trilu of a -inf square, or Range/Greater + Where
    kv_heads: int | None = None  # fewer K/V heads than query heads (GQA; 1 = MQA), repeated by repeat_kv
    cross: bool = False  # K/V from a second input ("memory") with its own length
    dtype: str = "float32"  # float16: the model in half precision, Softmax in float32 between two Casts
    seed: int = 0

    def __post_init__(self) -> None:
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"kv_heads={kv} does not divide heads={self.heads}")
        if self.causal != "none" and self.cross:
            raise ValueError("a causal mask needs queries and keys over the same sequence")
        if kv != self.heads and self.k_layout == "transpose_0231":
            raise ValueError("repeat_kv works on (B, N, T, H) keys; transpose_0231 transposes before the split")

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads


class _Builder:
    def __init__(self, v: Variant) -> None:
        self.v = v
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(v.seed)
        self.n = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n_{out}", **attrs))
        return out

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def comm(self, op: str, a: str, b: str) -> str:
        return self.op(op, [b, a] if self.v.commuted else [a, b])


def attention_model(v: Variant = Variant()) -> onnx.ModelProto:
    b = _Builder(v)
    hidden, heads, hd, kv = v.hidden, v.heads, v.head_dim, v.n_kv
    np_type = np.dtype(v.dtype)
    onnx_type = helper.np_dtype_to_tensor_dtype(np_type)
    scale = 1.0 / np.sqrt(hd)

    def scalar(value: float, hint: str) -> str:
        return b.const(np.array(value, np_type), hint)

    def proj(x: str, tag: str, width: int) -> str:
        w = b.const((b.rng.standard_normal((hidden, width)) * 1.5 / np.sqrt(hidden)).astype(np_type), f"w{tag}")
        y = b.op("MatMul", [x, w])
        if v.proj_bias:
            y = b.comm("Add", y, b.const(b.rng.standard_normal(width).astype(np_type) * 0.1, f"b{tag}"))
        return y

    def split(y: str, n: int) -> str:  # (B, S, n·H) → (B, S, n, H)
        return b.op("Reshape", [y, b.const(np.array([0, 0, n, hd], np.int64), "shape")])

    def repeat_kv(t: str) -> str:  # (B, kv, T, H) → (B, N, T, H), as transformers' repeat_kv exports
        if kv == heads:
            return t
        wide = b.op("Unsqueeze", [t, b.const(np.array([2], np.int64), "axes")])
        if v.symbolic:
            shape = b.op("Shape", [t])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([heads // kv], np.int64)), tail], axis=0)
        else:
            target = b.const(np.array([2, kv, heads // kv, kv_len, hd], np.int64), "shape")
        return b.op("Reshape", [b.op("Expand", [wide, target]), b.const(np.array([0, heads, -1, hd], np.int64))])

    def mul_scalar(x: str, value: float, op: str = "Mul") -> str:
        c = scalar(value if op == "Mul" else 1.0 / value, "scale")
        return b.comm("Mul", x, c) if op == "Mul" else b.op("Div", [x, c])

    seq, kv_seq = ("seq", "kv_seq" if v.cross else "seq") if v.symbolic else (5, 7 if v.cross else 5)
    batch = "batch" if v.symbolic else 2
    kv_len = kv_seq
    x = "x"
    memory = "memory" if v.cross else x
    q = b.op("Transpose", [split(proj(x, "q", hidden), heads)], perm=[0, 2, 1, 3])
    k_bsnh = split(proj(memory, "k", kv * hd), kv)
    v_ = repeat_kv(b.op("Transpose", [split(proj(memory, "v", kv * hd), kv)], perm=[0, 2, 1, 3]))

    if v.scale == "q_mul":
        q = mul_scalar(q, scale)
    if v.scale == "split_sqrt":
        q = mul_scalar(q, np.sqrt(scale))
    if v.k_layout == "transpose_0231":
        kt = b.op("Transpose", [k_bsnh], perm=[0, 2, 3, 1])
    else:
        k = repeat_kv(b.op("Transpose", [k_bsnh], perm=[0, 2, 1, 3]))
        if v.k_layout == "transpose_0132":
            kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        else:  # dynamo: fold (B, N) into one dim, transpose the last two, unfold
            shape = b.op("Shape", [k])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            k3 = b.op("Reshape", [k, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])
            k3t = b.op("Transpose", [k3], perm=[0, 2, 1])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            seq_dim = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([hd], np.int64)), seq_dim], axis=0)
            kt = b.op("Reshape", [k3t, target])
    if v.scale == "k_div":
        kt = mul_scalar(kt, scale, "Div")
    if v.scale == "split_sqrt":
        kt = mul_scalar(kt, np.sqrt(scale))
    s = b.op("MatMul", [q, kt])

    inputs = [helper.make_tensor_value_info("x", onnx_type, [batch, seq, hidden])]
    if v.cross:
        inputs.append(helper.make_tensor_value_info("memory", onnx_type, [batch, kv_seq, hidden]))
    dims = [batch, 1, 1, kv_seq]
    mask = None
    if v.mask.startswith("additive"):
        inputs.append(helper.make_tensor_value_info("mask", onnx_type, dims))
        mask = "mask"
    elif v.mask.startswith("where"):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, dims))
        mask = "mask"
    elif v.mask == "padding_int":  # HF eager: (1 - mask[:, None, None, :].float()) * finfo.min
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, kv_seq]))
        expanded = b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2], np.int64), "axes")])
        inverted = b.op("Sub", [scalar(1.0, "one"), b.op("Cast", [expanded], to=onnx_type)])
        mask = b.comm("Mul", inverted, scalar(np.finfo(np_type).min, "min"))

    def apply_scale(t: str) -> str:
        if v.scale == "qk_mul":
            return mul_scalar(t, scale)
        if v.scale == "qk_div":
            return mul_scalar(t, scale, "Div")
        if v.scale == "custom":
            return mul_scalar(t, 0.3)
        if v.scale == "runtime":  # Shape → Slice → Cast → Sqrt → Div, as dynamo writes it
            shape = b.op("Shape", [q])
            d = b.op("Slice", [shape, b.const(np.array([-1], np.int64)), b.const(np.array([4], np.int64))])
            root = b.op("Sqrt", [b.op("Cast", [d], to=onnx_type)])
            return b.op("Div", [t, root])
        return t

    if v.mask == "additive_before_scale":
        s = apply_scale(b.comm("Add", s, mask))
    else:
        s = apply_scale(s)
        if v.mask in ("additive", "padding_int"):
            s = b.op("Add", [s, mask])
        elif v.mask == "additive_first":
            s = b.op("Add", [mask, s])
        elif v.mask in ("where_neginf", "where_finfo"):
            fill = -np.inf if v.mask == "where_neginf" else np.finfo(np_type).min
            s = b.op("Where", [mask, s, scalar(fill, "fill")])
        elif v.mask == "where_reversed":  # mask True = masked out
            inverted = b.op("Not", [mask])
            s = b.op("Where", [inverted, scalar(-1e4 if v.dtype == "float16" else -1e9, "fill"), s])
    s = _causal(b, v, s, x, np_type)
    if v.dtype == "float16":  # transformers: softmax(..., dtype=float32).to(query.dtype)
        s = b.op("Cast", [s], to=TensorProto.FLOAT)
    p = b.op("Softmax", [s], axis=-1)
    if v.dtype == "float16":
        p = b.op("Cast", [p], to=onnx_type)
    if v.guard:
        p = b.op("Where", [b.op("IsNaN", [p]), scalar(0.0, "zero"), p])
    o = b.op("MatMul", [p, v_])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    o = b.op("Reshape", [o, b.const(np.array([0, 0, hidden], np.int64), "shape")])
    b.nodes.append(helper.make_node("Identity", [o], ["y"], name="n_output"))
    out = helper.make_tensor_value_info("y", onnx_type, None)
    graph = helper.make_graph(b.nodes, "attention", inputs, [out], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="egfuse.testing")
    model.ir_version = 8
    return model


def _causal(b: _Builder, v: Variant, s: str, x: str, np_type: np.dtype) -> str:
    """Mask key j > query i, with the sequence length read from the input's shape as exporters do."""
    if v.causal == "none":
        return s
    length = b.op("Slice", [b.op("Shape", [x]), b.const(np.array([1], np.int64)), b.const(np.array([2], np.int64))])
    if v.causal == "trilu":  # torch.triu(torch.full((S, S), -inf), diagonal=1), added to the scores
        square = b.op("Concat", [length, length], axis=0)
        full = b.op("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([-np.inf], np_type)))
        return b.comm("Add", s, b.op("Trilu", [full, b.const(np.array(1, np.int64), "k")], upper=1))
    # arange(S)[None, :] > arange(S)[:, None] → Where(future, finfo.min, scores)
    count = b.op("Squeeze", [length, b.const(np.array([0], np.int64), "axes")])
    positions = b.op("Range", [b.const(np.array(0, np.int64)), count, b.const(np.array(1, np.int64))])
    keys = b.op("Unsqueeze", [positions, b.const(np.array([0], np.int64), "axes")])
    queries = b.op("Unsqueeze", [positions, b.const(np.array([1], np.int64), "axes")])
    future = b.op("Greater", [keys, queries])
    return b.op("Where", [future, b.const(np.array(np.finfo(np_type).min, np_type), "fill"), s])


def feeds_for(model: onnx.ModelProto, seed: int = 0, batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    """Random inputs with real padding: the last sequence's final position is masked out.

    Keys/values of cross-attention (``kv_seq``) are two positions longer than the queries, so a mix-up of
    the two lengths cannot pass unnoticed."""
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "seq": seq, "kv_seq": seq + 2}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tensor_type = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if tensor_type.elem_type == TensorProto.INT64:  # 1 = attend, 0 = padding
            m = np.ones(dims, np.int64)
            m[-1, -1] = 0
            feeds[inp.name] = m
        elif tensor_type.elem_type == TensorProto.BOOL:
            m = np.ones(dims, bool)
            m[-1, ..., -1] = False
            feeds[inp.name] = m
        elif inp.name == "mask":
            m = np.zeros(dims, dtype)
            m[-1, ..., -1] = -10000.0
            feeds[inp.name] = m
        else:
            feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


def _is_valid(**choices) -> bool:
    try:
        Variant(**choices)
    except ValueError:
        return False
    return True


def variants():  # pragma: no cover - exercised by the property tests
    """A hypothesis strategy over :class:`Variant` (imported lazily: hypothesis is a test dependency)."""
    from hypothesis import strategies as st

    choices = st.fixed_dictionaries(
        {
            "scale": st.sampled_from(SCALES),
            "k_layout": st.sampled_from(K_LAYOUTS),
            "mask": st.sampled_from(MASKS),
            "guard": st.booleans(),
            "commuted": st.booleans(),
            "proj_bias": st.booleans(),
            "heads": st.sampled_from([1, 2, 4]),
            "head_dim": st.sampled_from([8, 16, 32, 64, 128]),
            "symbolic": st.booleans(),
            "causal": st.sampled_from(CAUSAL),
            "kv_heads": st.sampled_from([None, None, 1, 2]),
            "cross": st.booleans(),
            "dtype": st.sampled_from(DTYPES),
            "seed": st.integers(0, 2**16),
        }
    )
    return choices.filter(lambda c: _is_valid(**c)).map(lambda c: Variant(**c))


__all__ = [
    "CAUSAL",
    "DTYPES",
    "K_LAYOUTS",
    "MASKS",
    "SCALES",
    "Variant",
    "attention_model",
    "feeds_for",
    "replace",
    "variants",
]
