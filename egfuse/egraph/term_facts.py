"""Facts attached to e-classes: what is known of a term beyond its constructor — its rank, the value of a
one-element constant, its element type, a dim, whether it is a stored weight, finite, the same for every head,
a table with repeated halves — and the permutation tables. Lowering states them of the graph's values, the
rules (:mod:`egfuse.rules.facts`) carry them to the terms they build, and rules match on them as conditions.

Kept apart from the constructors (:mod:`egfuse.egraph.lang`): they are functions and relations over ``Tensor``,
not ways to build one, and the explanations of a miss read them back by name
(:meth:`egfuse.egraph.session.Session.freeze`).
"""

from __future__ import annotations

from egglog import String, StringLike, f64, function, i64, i64Like, relation

from egfuse.egraph.lang import Tensor

__all__ = [
    "dim_of", "dtype_of", "finite", "halves_repeat", "head_invariant", "heads_of", "is_weight", "last_dim",
    "per_feature", "perm_then", "rank_of", "scalar_of", "swap_last2",
]  # fmt: skip


@function(merge=lambda old, new: old)
def scalar_of(x: Tensor) -> f64:
    """The value of a one-element constant (a scale, a mask fill, a zero)."""


@function(merge=lambda old, new: old)
def rank_of(x: Tensor) -> i64:
    """The rank of a tensor, where known."""


@function(merge=lambda old, new: old)
def dtype_of(x: Tensor) -> i64:
    """The ONNX element type (TensorProto enum) of a tensor, where known."""


@function(merge=lambda old, new: old)
def dim_of(x: Tensor, axis: i64Like) -> String:
    """A dim of a constant (axis counted from the end when negative), where known."""


@function(merge=lambda old, new: old)
def heads_of(x: Tensor) -> i64:
    """The static size of the heads axis (−3) of a (B, N, S, H) tensor: what joining heads adds up."""


@function
def perm_then(first: StringLike, then: StringLike) -> String:
    """Composition table: ``transpose(transpose(x, first), then) == transpose(x, perm_then(first, then))``."""


@function
def swap_last2(perm: StringLike) -> String:
    """``perm`` with its last two entries exchanged: the layout of K when a perm produces Kᵀ."""


is_weight = relation("is_weight", Tensor)
"""A constant initializer (projection weight or bias): packable into a fused op's weights."""

per_feature = relation("per_feature", Tensor)
"""A stored weight whose axes but the last are all 1 (of any rank): one value per feature of the last axis, as a
norm's γ and β are (Keras stores them as (1, 1, D))."""

head_invariant = relation("head_invariant", Tensor)
"""The same for every head: its heads axis (−3) is 1 or absent (a padding or causal mask, no position bias), so
attention on a few heads and on all of them read it alike."""

finite = relation("finite", Tensor)
"""Holds no ±inf or NaN (graph float inputs are assumed finite): a softmax over it never yields NaN rows."""


@function(merge=lambda old, new: old)
def last_dim(x: Tensor) -> i64:
    """The static size of the last axis, where known: how wide a rotation is."""


halves_repeat = relation("halves_repeat", Tensor)
"""Its last axis is two equal halves, ``t[…, R/2:] == t[…, :R/2]``: a rotate-half cos/sin table."""
