"""The shape of a term the rules built, from its constructor's meaning: one rule per constructor of
:mod:`egfuse.egraph.lang`, in a table, so adding a constructor is adding a line (``split_heads(x, N, H)`` is x's shape
with its last dim split into (N, H), ``mha`` returns (B, S, N·Hv) …). :mod:`egfuse.egraph.shapes` applies these to a
fixpoint over the e-graph; a constructor missing from the table has no shape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from egfuse.analysis.dims import Dim, Shape
from egfuse.egraph.enodes import value_index, view
from egfuse.egraph.session import EClass, ENode

ShapeRule = Callable[[list[Shape], Any], Shape | None]
"""A constructor's shape from its children's shapes and its arguments by name (:func:`egfuse.egraph.enodes.view`)."""

_ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "where", "maximum", "pow"})
_SAME = frozenset({"isnan", "sqrt", "tanh", "cast", "softmax", "nan_to_zero", "softcap", "reciprocal", "normalized",
                   "layer_norm", "rms_normalized", "rms_norm", "erf", "gelu_cdf", "gelu", "bias_gelu",
                   "skip_layer_norm", "skip_rms_norm", "neg", "cos", "sin", "rotary"})  # fmt: skip


def term_shape(node: ENode, shapes: Mapping[EClass, Shape]) -> Shape | None:
    """``node``'s shape where its constructor's rule gives one from its children's known shapes."""
    if value_index(node) is not None:
        return None  # a graph value's shape is read from the graph (class_shapes), not derived
    op, a = node.op, view(node)
    kids = [shapes.get(c) for c in node.children]
    if any(k is None for k in kids) and op not in ("zero_bias", "unit_scale"):
        return None
    rule = SHAPE_RULES.get(op)
    return None if rule is None else rule(kids, a)


def _mul(a: Dim | None, b: Dim | None) -> Dim | None:
    return None if a is None or b is None else a * b


def _broadcast(*shapes: Shape) -> Shape | None:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim | None] = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        wide = [d for d in dims if d is None or d != Dim(1)]
        out.append(wide[0] if wide else Dim(1))
    return tuple(out)


# --- elementwise, layout and pieces -----------------------------------------------------------------------------


def _elementwise(kids: list[Shape], a: Any) -> Shape | None:
    return _broadcast(*[k for k in kids if k is not None])


def _same(kids: list[Shape], a: Any) -> Shape | None:
    return kids[0]


def _zero_bias(kids: list[Shape], a: Any) -> Shape | None:
    return (kids[0][-1],) if kids[0] else None


def _unit_scale(kids: list[Shape], a: Any) -> Shape | None:
    return (Dim(int(a.width)),)


def _last_axis_kept(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-1], Dim(1)) if kids[0] else None


def _grown(axis: int, kids: list[Shape], a: Any) -> Shape | None:
    """One more row (``zero_row``, axis −2) or column (``zero_col``, −1) of zeros."""
    x = kids[0]
    if len(x) < -axis or x[axis] is None:
        return None
    return tuple(x[axis].plus(Dim(1)) if i == len(x) + axis else d for i, d in enumerate(x))


def _sink_col(kids: list[Shape], a: Any) -> Shape | None:
    e, k = kids
    return (*e[:-1], k[-2].plus(Dim(1))) if e and len(k) >= 2 and k[-2] is not None else None


def _transpose(kids: list[Shape], a: Any) -> Shape | None:
    perm = [int(p) for p in a.perm.split(",")]
    return tuple(kids[0][p] for p in perm) if sorted(perm) == list(range(len(kids[0]))) else None


def _matmul(kids: list[Shape], a: Any) -> Shape | None:
    x, y = kids
    if len(x) < 2 or len(y) < 2:
        return None
    lead = _broadcast(x[:-2], y[:-2])
    return None if lead is None else (*lead, x[-2], y[-1])


def _split_heads(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-1], Dim.parse(a.heads), Dim.parse(a.head_dim))


def _merge_heads(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-2], _mul(kids[0][-2], kids[0][-1])) if len(kids[0]) >= 2 else None


def _merge_lead(kids: list[Shape], a: Any) -> Shape | None:
    return (_mul(kids[0][0], kids[0][1]), *kids[0][2:]) if len(kids[0]) >= 2 else None


def _split_lead(kids: list[Shape], a: Any) -> Shape | None:
    second = Dim.parse(a.second)
    first = kids[0][0].div(second) if kids[0] and kids[0][0] is not None else None
    return (first, second, *kids[0][1:])


def _concat(kids: list[Shape], a: Any) -> Shape | None:
    x, y, axis = kids[0], kids[1], int(a.axis)
    if len(x) != len(y) or not -len(x) <= axis < 0:
        return None
    total = None if x[axis] is None or y[axis] is None else x[axis].plus(y[axis])
    return tuple(total if i == len(x) + axis else d for i, d in enumerate(x))


def _part(kids: list[Shape], a: Any) -> Shape | None:
    x, axis = kids[0], int(a.axis)
    if not -len(x) <= axis < 0:
        return None
    return tuple(Dim(int(a.size)) if i == len(x) + axis else d for i, d in enumerate(x))


def _squeeze(kids: list[Shape], a: Any) -> Shape | None:
    at = len(kids[0]) + int(a.axis)
    return (*kids[0][:at], *kids[0][at + 1 :]) if 0 <= at < len(kids[0]) else None


def _unsqueeze(kids: list[Shape], a: Any) -> Shape | None:
    at = len(kids[0]) + 1 + int(a.axis)
    return (*kids[0][:at], Dim(1), *kids[0][at:]) if 0 <= at <= len(kids[0]) else None


def _rows(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[1], *kids[0][1:]) if kids[0] else None


def _last_halved_or_doubled(halve: bool, kids: list[Shape], a: Any) -> Shape | None:
    """``strided`` takes every other element of the last axis, ``interleave`` zips two halves back into it."""
    last = kids[0][-1] if kids[0] else None
    if last is None:
        return None
    return (*kids[0][:-1], last.div(Dim(2)) if halve else _mul(last, Dim(2)))


def _tile_lead(kids: list[Shape], a: Any) -> Shape | None:
    m, like = kids[0], kids[1]
    return (like[0], *m[2:]) if len(m) >= 2 and like else None


# --- heads in groups ------------------------------------------------------------------------------------------


def _grouped(op: str, kids: list[Shape], a: Any) -> Shape | None:
    """The shapes of grouped heads (:mod:`egfuse.rules.groups`): (B, K·G, T, X) ↔ (B, K, G, T, X) ↔ (B·K, G·T, X)."""
    x, groups = kids[0], Dim.parse(a.groups)
    kv_heads = Dim.parse(a.kv_heads) if hasattr(a, "kv_heads") else None  # only the folds name K
    if op == "group_heads" and len(x) == 4:
        heads = x[1].div(groups) if x[1] is not None else None
        return (x[0], heads, groups, *x[2:])
    if op == "ungroup_heads" and len(x) == 5:
        return (x[0], _mul(x[1], x[2]), *x[3:])
    if op == "fold_groups" and len(x) == 4:
        return (_mul(x[0], kv_heads), _mul(groups, x[2]), x[3])
    if op == "unfold_groups" and len(x) == 3:
        batch = x[0].div(kv_heads) if x[0] is not None else None
        rows = x[1].div(groups) if x[1] is not None else None
        return (batch, _mul(kv_heads, groups), rows, x[2])
    return None


def _repeat_heads(kids: list[Shape], a: Any) -> Shape | None:
    return (kids[0][0], _mul(kids[0][1], Dim.parse(a.times)), *kids[0][2:]) if len(kids[0]) == 4 else None


# --- attention --------------------------------------------------------------------------------------------------


def _scores(kids: list[Shape], a: Any) -> Shape | None:
    q, k = kids[0], kids[1]
    return (*q[:-1], k[-2]) if len(q) >= 2 and len(k) >= 2 else None


def _attend(kids: list[Shape], a: Any) -> Shape | None:
    q, v = kids[0], kids[2]
    return (*q[:-1], v[-1])


def _mha(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-1], kids[2][-1])


def _gqa(kids: list[Shape], a: Any) -> Shape | None:
    n, nk = Dim.parse(a.heads), Dim.parse(a.kv_heads)
    width = kids[2][-1]
    per_head = width.div(nk) if width is not None else None
    return (*kids[0][:-1], _mul(per_head, n))


def _mha_kv4(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-1], _mul(kids[2][-1], Dim.parse(a.heads)))


def _packed_attention(kids: list[Shape], a: Any) -> Shape | None:
    return (*kids[0][:-1], kids[3][-1])


SHAPE_RULES: dict[str, ShapeRule] = {
    **dict.fromkeys(_ELEMENTWISE, _elementwise),
    **dict.fromkeys(_SAME, _same),
    "zero_bias": _zero_bias,
    "unit_scale": _unit_scale,
    "reduce_mean": _last_axis_kept,
    "row_max": _last_axis_kept,
    "zero_row": partial(_grown, -2),
    "zero_col": partial(_grown, -1),
    "sink_col": _sink_col,
    "transpose": _transpose,
    "matmul": _matmul,
    "split_heads": _split_heads,
    "merge_heads": _merge_heads,
    "merge_lead": _merge_lead,
    "split_lead": _split_lead,
    "concat": _concat,
    "part": _part,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "rows": _rows,
    "strided": partial(_last_halved_or_doubled, True),
    "interleave": partial(_last_halved_or_doubled, False),
    "tile_lead": _tile_lead,
    **{op: partial(_grouped, op) for op in ("group_heads", "ungroup_heads", "fold_groups", "unfold_groups")},
    "repeat_heads": _repeat_heads,
    "scores": _scores,
    "probs": _scores,
    "attend": _attend,
    "attend_z": _attend,
    "mha": _mha,
    "mha_standard": _mha,
    "gqa": _gqa,
    "mha_kv4": _mha_kv4,
    "packed_attention": _packed_attention,
}
"""Each constructor's shape rule; :func:`term_shape` looks a node's constructor up here."""
