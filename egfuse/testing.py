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
    seed: int = 0

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


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
    hidden, heads, hd = v.hidden, v.heads, v.head_dim
    scale = 1.0 / np.sqrt(hd)

    def proj(x: str, tag: str) -> str:
        w = b.const((b.rng.standard_normal((hidden, hidden)) * 1.5 / np.sqrt(hidden)).astype(np.float32), f"w{tag}")
        y = b.op("MatMul", [x, w])
        if v.proj_bias:
            y = b.comm("Add", y, b.const(b.rng.standard_normal(hidden).astype(np.float32) * 0.1, f"b{tag}"))
        return y

    def split(y: str) -> str:  # (B, S, N·H) → (B, S, N, H)
        return b.op("Reshape", [y, b.const(np.array([0, 0, heads, hd], np.int64), "shape")])

    def mul_scalar(x: str, value: float, op: str = "Mul") -> str:
        c = b.const(np.array(value if op == "Mul" else 1.0 / value, np.float32), "scale")
        return b.comm("Mul", x, c) if op == "Mul" else b.op("Div", [x, c])

    x = "x"
    q = b.op("Transpose", [split(proj(x, "q"))], perm=[0, 2, 1, 3])
    k_bsnh = split(proj(x, "k"))
    v_ = b.op("Transpose", [split(proj(x, "v"))], perm=[0, 2, 1, 3])

    if v.scale == "q_mul":
        q = mul_scalar(q, scale)
    if v.scale == "split_sqrt":
        q = mul_scalar(q, np.sqrt(scale))
    if v.k_layout == "transpose_0231":
        kt = b.op("Transpose", [k_bsnh], perm=[0, 2, 3, 1])
    else:
        k = b.op("Transpose", [k_bsnh], perm=[0, 2, 1, 3])
        if v.k_layout == "transpose_0132":
            kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        else:  # dynamo: fold (B, N) into one dim, transpose the last two, unfold
            shape = b.op("Shape", [k])
            tail = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64))])
            k3 = b.op("Reshape", [k, b.op("Concat", [b.const(np.array([-1], np.int64)), tail], axis=0)])
            k3t = b.op("Transpose", [k3], perm=[0, 2, 1])
            lead = b.op("Slice", [shape, b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64))])
            seq = b.op("Slice", [shape, b.const(np.array([2], np.int64)), b.const(np.array([3], np.int64))])
            target = b.op("Concat", [lead, b.const(np.array([hd], np.int64)), seq], axis=0)
            kt = b.op("Reshape", [k3t, target])
    if v.scale == "k_div":
        kt = mul_scalar(kt, scale, "Div")
    if v.scale == "split_sqrt":
        kt = mul_scalar(kt, np.sqrt(scale))
    s = b.op("MatMul", [q, kt])

    inputs = [
        helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, ["batch", "seq", hidden] if v.symbolic else [2, 5, hidden]
        )
    ]
    dims = ["batch", 1, 1, "seq"] if v.symbolic else [2, 1, 1, 5]
    mask = None
    if v.mask.startswith("additive"):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, dims))
        mask = "mask"
    elif v.mask.startswith("where"):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, dims))
        mask = "mask"
    elif v.mask == "padding_int":  # HF eager: (1 - mask[:, None, None, :].float()) * finfo.min
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [dims[0], dims[3]]))
        expanded = b.op("Unsqueeze", ["attention_mask", b.const(np.array([1, 2], np.int64), "axes")])
        inverted = b.op("Sub", [b.const(np.array(1.0, np.float32), "one"), b.op("Cast", [expanded], to=1)])
        mask = b.comm("Mul", inverted, b.const(np.array(np.finfo(np.float32).min, np.float32), "min"))

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
            root = b.op("Sqrt", [b.op("Cast", [d], to=TensorProto.FLOAT)])
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
            fill = -np.inf if v.mask == "where_neginf" else np.finfo(np.float32).min
            s = b.op("Where", [mask, s, b.const(np.array(fill, np.float32), "fill")])
        elif v.mask == "where_reversed":  # mask True = masked out
            inverted = b.op("Not", [mask])
            s = b.op("Where", [inverted, b.const(np.array(-1e9, np.float32), "fill"), s])
    p = b.op("Softmax", [s], axis=-1)
    if v.guard:
        p = b.op("Where", [b.op("IsNaN", [p]), b.const(np.array(0.0, np.float32), "zero"), p])
    o = b.op("MatMul", [p, v_])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    o = b.op("Reshape", [o, b.const(np.array([0, 0, hidden], np.int64), "shape")])
    b.nodes.append(helper.make_node("Identity", [o], ["y"], name="n_output"))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(b.nodes, "attention", inputs, [out], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="egfuse.testing")
    model.ir_version = 8
    return model


def feeds_for(model: onnx.ModelProto, seed: int = 0, batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    """Random inputs with real padding: the last sequence's final position is masked out."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else {"batch": batch, "seq": seq}[d.dim_param]
            for d in inp.type.tensor_type.shape.dim
        ]
        if inp.type.tensor_type.elem_type == TensorProto.INT64:  # 1 = attend, 0 = padding
            m = np.ones(dims, np.int64)
            m[-1, -1] = 0
            feeds[inp.name] = m
        elif inp.type.tensor_type.elem_type == TensorProto.BOOL:
            m = np.ones(dims, bool)
            m[-1, ..., -1] = False
            feeds[inp.name] = m
        elif inp.name == "mask":
            m = np.zeros(dims, np.float32)
            m[-1, ..., -1] = -10000.0
            feeds[inp.name] = m
        else:
            feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def variants():  # pragma: no cover - exercised by the property tests
    """A hypothesis strategy over :class:`Variant` (imported lazily: hypothesis is a test dependency)."""
    from hypothesis import strategies as st

    return st.builds(
        Variant,
        scale=st.sampled_from(SCALES),
        k_layout=st.sampled_from(K_LAYOUTS),
        mask=st.sampled_from(MASKS),
        guard=st.booleans(),
        commuted=st.booleans(),
        proj_bias=st.booleans(),
        heads=st.sampled_from([1, 2, 4]),
        head_dim=st.sampled_from([8, 16, 32, 64, 128]),
        symbolic=st.booleans(),
        seed=st.integers(0, 2**16),
    )


__all__ = ["K_LAYOUTS", "MASKS", "SCALES", "Variant", "attention_model", "feeds_for", "replace", "variants"]
