"""The shape of every e-class, symbolic: what the cost model prices and what raising needs to split heads.

An e-class holding a graph value has that value's shape (:class:`egfuse.facts.GraphFacts`); a term the rules
built gets its shape from its constructor's meaning (``split_heads(x, N, H)`` is x's shape with its last dim
split into (N, H), ``mha`` returns (B, S, N·Hv) …), computed to a fixpoint over the e-graph. Dims stay
symbolic (:class:`egfuse.dims.Dim`); :func:`bind` turns them into numbers for a given shape binding.
"""

from __future__ import annotations

from collections.abc import Mapping

from egfuse.dims import Dim, evaluate
from egfuse.enodes import value_index, view
from egfuse.facts import GraphFacts
from egfuse.lower import Lowered
from egfuse.session import EClass, ENode

Shape = tuple[Dim | None, ...]

_ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "where", "maximum", "pow"})
_SAME = frozenset({"isnan", "sqrt", "tanh", "cast", "softmax", "nan_to_zero", "softcap", "reciprocal", "normalized",
                   "layer_norm", "rms_normalized", "rms_norm", "erf", "gelu_cdf", "gelu", "bias_gelu",
                   "skip_layer_norm", "skip_rms_norm", "neg", "cos", "sin"})  # fmt: skip
_MAX_PASSES = 8


def class_shapes(classes: Mapping[EClass, list[ENode]], lowered: Lowered, facts: GraphFacts) -> dict[EClass, Shape]:
    """Each e-class's shape where some member's meaning gives it (a class with none is absent)."""
    shapes: dict[EClass, Shape] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            if value_index(node) is not None:
                shape = _value_shape(lowered.values[value_index(node)], facts)
                if shape is not None:
                    shapes[cid] = tuple(shape)
                    break
            elif node.op in ("full_like", "no_bias"):
                shapes[cid] = ()
    for _ in range(_MAX_PASSES):
        changed = False
        for cid, nodes in classes.items():
            known = shapes.get(cid)
            if known is not None and not _invented(known):
                continue
            for node in nodes:
                shape = _node_shape(node, shapes)
                # A member's meaning beats shape inference's invented names (a repeated cache's length).
                if shape is not None and (known is None or _invented(shape) < _invented(known)):
                    shapes[cid] = known = shape
                    changed = True
        if not changed:
            break
    return shapes


def _invented(shape: Shape) -> int:
    return sum(d is None or d.invented for d in shape)


def _value_shape(value: object, facts: GraphFacts) -> Shape | None:
    """A graph value's shape; where shape inference invented a dim of a Concat's output (a KV cache's
    ``past + new``), the sum of its inputs' dims along the axis."""
    shape = facts.shape(value)
    node = value.producer()
    if shape is None or not any(d is not None and d.invented for d in shape) or node is None:
        return None if shape is None else tuple(shape)
    if node.op_type != "Concat" or None in node.inputs or "axis" not in node.attributes:
        return tuple(shape)
    parts = [facts.shape(v) for v in node.inputs]
    if any(p is None or len(p) != len(shape) for p in parts):
        return tuple(shape)
    axis = node.attributes["axis"].value % len(shape)
    total = parts[0][axis]
    for part in parts[1:]:
        total = None if total is None or part[axis] is None else total.plus(part[axis])
    return tuple(total if i == axis else (parts[0][i] if d is None or d.invented else d) for i, d in enumerate(shape))


def _node_shape(node: ENode, shapes: Mapping[EClass, Shape]) -> Shape | None:
    if value_index(node) is not None:
        return None  # a graph value's shape is read from the graph (class_shapes), not derived
    op, a = node.op, view(node)
    kids = [shapes.get(c) for c in node.children]
    if any(k is None for k in kids) and op not in ("zero_bias",):
        return None
    if op in _ELEMENTWISE:
        return _broadcast(*[k for k in kids if k is not None])
    if op in _SAME:
        return kids[0]
    if op == "zero_bias":
        return (kids[0][-1],) if kids[0] else None
    if op == "reduce_mean":
        return (*kids[0][:-1], Dim(1)) if kids[0] else None
    if op == "transpose":
        perm = [int(p) for p in a.perm.split(",")]
        return tuple(kids[0][p] for p in perm) if sorted(perm) == list(range(len(kids[0]))) else None
    if op == "matmul":
        x, y = kids
        if len(x) < 2 or len(y) < 2:
            return None
        lead = _broadcast(x[:-2], y[:-2])
        return None if lead is None else (*lead, x[-2], y[-1])
    if op == "split_heads":
        return (*kids[0][:-1], Dim.parse(a.heads), Dim.parse(a.head_dim))
    if op == "merge_heads":
        return (*kids[0][:-2], _mul(kids[0][-2], kids[0][-1])) if len(kids[0]) >= 2 else None
    if op == "merge_lead":
        return (_mul(kids[0][0], kids[0][1]), *kids[0][2:]) if len(kids[0]) >= 2 else None
    if op == "split_lead":
        second = Dim.parse(a.second)
        first = kids[0][0].div(second) if kids[0] and kids[0][0] is not None else None
        return (first, second, *kids[0][1:])
    if op == "concat":
        x, y, axis = kids[0], kids[1], int(a.axis)
        if len(x) != len(y) or not -len(x) <= axis < 0:
            return None
        total = None if x[axis] is None or y[axis] is None else x[axis].plus(y[axis])
        return tuple(total if i == len(x) + axis else d for i, d in enumerate(x))
    if op == "part":
        x, axis = kids[0], int(a.axis)
        if not -len(x) <= axis < 0:
            return None
        return tuple(Dim(int(a.size)) if i == len(x) + axis else d for i, d in enumerate(x))
    if op == "rotary":
        return kids[0]
    if op == "squeeze":
        at = len(kids[0]) + int(a.axis)
        return (*kids[0][:at], *kids[0][at + 1 :]) if 0 <= at < len(kids[0]) else None
    if op == "unsqueeze":
        at = len(kids[0]) + 1 + int(a.axis)
        return (*kids[0][:at], Dim(1), *kids[0][at:]) if 0 <= at <= len(kids[0]) else None
    if op == "rows":
        return (*kids[1], *kids[0][1:]) if kids[0] else None
    if op in ("strided", "interleave"):
        last = kids[0][-1] if kids[0] else None
        if last is None:
            return None
        return (*kids[0][:-1], last.div(Dim(2)) if op == "strided" else _mul(last, Dim(2)))
    if op == "tile_lead":
        m, like = kids[0], kids[1]
        return (like[0], *m[2:]) if len(m) >= 2 and like else None
    if op in ("group_heads", "ungroup_heads", "fold_groups", "unfold_groups"):
        kv_heads = Dim.parse(a.kv_heads) if hasattr(a, "kv_heads") else None  # only the folds name K
        return _grouped(op, kids[0], Dim.parse(a.groups), kv_heads)
    if op == "repeat_heads":
        return (kids[0][0], _mul(kids[0][1], Dim.parse(a.times)), *kids[0][2:]) if len(kids[0]) == 4 else None
    if op in ("scores", "probs"):
        q, k = kids[0], kids[1]
        return (*q[:-1], k[-2]) if len(q) >= 2 and len(k) >= 2 else None
    if op in ("attend", "attend_z"):
        q, v = kids[0], kids[2]
        return (*q[:-1], v[-1])
    if op == "mha":
        return (*kids[0][:-1], kids[2][-1])
    if op == "gqa":
        n, nk = Dim.parse(a.heads), Dim.parse(a.kv_heads)
        width = kids[2][-1]
        per_head = width.div(nk) if width is not None else None
        return (*kids[0][:-1], _mul(per_head, n))
    if op == "mha_kv4":
        return (*kids[0][:-1], _mul(kids[2][-1], Dim.parse(a.heads)))
    if op == "packed_attention":
        return (*kids[0][:-1], kids[3][-1])
    return None


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


# --- binding: symbolic dims to numbers ------------------------------------------------------------------------

TYPICAL = {"batch": 1, "past": 256}
"""Sizes a dim whose symbol names it takes when the user binds nothing (substring match, first wins); every
other symbolic length is :data:`TYPICAL_LENGTH`."""
TYPICAL_LENGTH = 128


def bind(dim: Dim | None, binding: Mapping[str, int]) -> int:
    """A number for ``dim``: its value, or each symbol's bound size (the user's, else a typical one)."""
    if dim is None:
        return TYPICAL_LENGTH
    total = dim.coef
    for sym in dim.syms:
        total *= _bind_symbol(sym, binding)
    return max(1, total)


def _bind_symbol(sym: str, binding: Mapping[str, int]) -> int:
    if sym in binding:
        return int(binding[sym])
    if sym.startswith("unk__"):  # shape inference lost track, and no member's meaning said more (class_shapes
        return 1  # prefers one): often a broadcast axis, so 1, never 128 — a mask of four such dims is not 128⁴
    if not sym.isidentifier():  # an expression over symbols (``s0 + 1``, ``Max(0, 1 - s)``): its value
        value = evaluate(sym, lambda name: _bind_symbol(name, binding))
        return TYPICAL_LENGTH if value is None else value
    lowered = sym.lower()
    for word, size in TYPICAL.items():
        if word in lowered:
            return int(binding.get(word, size))
    return int(binding.get("seq", TYPICAL_LENGTH))


def bound(shape: Shape | None, binding: Mapping[str, int]) -> tuple[int, ...] | None:
    return None if shape is None else tuple(bind(d, binding) for d in shape)


def static(shape: Shape | None, axis: int) -> int | None:
    """The dim at ``axis`` where it is a number (None where the shape, the axis or the number is unknown)."""
    if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] is None:
        return None
    return shape[axis].static


def _grouped(op: str, x: Shape, groups: Dim, kv_heads: Dim | None) -> Shape | None:
    """The shapes of grouped heads (:mod:`egfuse.rules.groups`): (B, K·G, T, X) ↔ (B, K, G, T, X) ↔ (B·K, G·T, X)."""
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
