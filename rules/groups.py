"""Grouped heads: grouped-query attention written one group of query heads at a time.

Keras' ``MultiHeadAttention`` with fewer KV heads (Gemma, Llama, Mistral in keras-hub) computes the scores with
the einsum ``btkgh,bskh->bkgts``: the N = K·G query heads viewed as K groups of G (``group_heads``), each group
against its one KV head. tf2onnx lowers that einsum to a batched 3D MatMul whose batch is (B·K) and whose rows
are the group's G·T query rows (``fold_groups``). Two identities make it the attention the other families know:

* **rows of a group share their KV head**: ``fold_groups(Q) @ merge_lead(Y) = fold_groups(Q @ repeat_heads(Y, G))``
  — row block g of batch entry (b, k) is query head k·G + g, and ``repeat_heads`` gives that head KV head k.
  The MatMul's batches are B·K on both sides (the same K: the e-graph strings must be equal), so either both
  have the same B or K = 1 and the batch of one broadcasts — the same broadcast on both sides;
* **a view commutes with what acts along the last axes**: a softmax, a cast, a scalar, and a mask whose two
  group axes are 1 (the (B, 1, 1, T, S) padding or causal mask broadcast over K and G is the (B, 1, T, S) mask
  broadcast over the N heads). ``group_heads`` moves outward through them, ``ungroup_heads`` inward, and the
  views cancel where the graph folds the probabilities back into rows for the MatMul with V.

A mask that differs per KV head (its group axis not 1) does not broadcast the same way over N heads: it stays.
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rewrite, rule, ruleset, set_, union

from egfuse.egraph.lang import Tensor
from egfuse.egraph.term_facts import dim_of, finite, head_invariant, rank_of, scalar_of

ONE = "1"
BINARY = (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div)


@ruleset
def rules(x: Tensor, y: Tensor, m: Tensor, c: Tensor, k: String, g: String, r: i64, f: f64):
    # The views and their inverses cancel.
    yield rewrite(Tensor.ungroup_heads(Tensor.group_heads(x, g), g)).to(x)
    yield rewrite(Tensor.group_heads(Tensor.ungroup_heads(x, g), g)).to(x)
    yield rewrite(Tensor.unfold_groups(Tensor.fold_groups(x, k, g), k, g)).to(x)
    yield rewrite(Tensor.fold_groups(Tensor.unfold_groups(x, k, g), k, g)).to(x)
    # With one KV head the groups are the batch split by 1: (B, 1, N, T, X) joined is (B, N, T, X) either way.
    yield rewrite(Tensor.ungroup_heads(Tensor.split_lead(x, ONE), g)).to(x)
    yield rewrite(Tensor.merge_lead(Tensor.group_heads(x, g), ONE)).to(x)
    # Rows of a group share their KV head: a grouped batched MatMul is attention's MatMul with K/V repeated.
    yield rewrite(Tensor.matmul(Tensor.fold_groups(x, k, g), Tensor.merge_lead(y, k))).to(
        Tensor.fold_groups(Tensor.matmul(x, Tensor.repeat_heads(y, g)), k, g),
        eq(rank_of(Tensor.merge_lead(y, k))).to(i64(3)),
    )
    # Repeating heads commutes with a transpose of the last two axes (Kᵀ repeated is K repeated, transposed).
    yield rewrite(Tensor.repeat_heads(Tensor.transpose(x, "0,1,3,2"), g)).to(
        Tensor.transpose(Tensor.repeat_heads(x, g), "0,1,3,2")
    )
    yield rule(Tensor.repeat_heads(x, g), rank_of(x) == r).then(set_(rank_of(Tensor.repeat_heads(x, g))).to(r))
    # What acts along the last axes commutes with the views: outward through group_heads …
    for lead in (lambda t: Tensor.group_heads(t, g), lambda t: Tensor.fold_groups(t, k, g)):
        yield rewrite(Tensor.softmax(lead(x))).to(lead(Tensor.softmax(x)))
        yield rewrite(Tensor.cast(lead(x), r)).to(lead(Tensor.cast(x, r)))
        for binary in BINARY:  # a scalar, either side (a scale on the folded query stays in: the MatMul rule
            # takes any query, and the scores absorb the scale once the views cancel)
            yield rewrite(binary(lead(x), c)).to(lead(binary(x, c)), scalar_of(c) == f)
            yield rewrite(binary(c, lead(x))).to(lead(binary(c, x)), scalar_of(c) == f)
    # … and a mask whose group axes are 1 is the (B, 1, T, S) mask of the N heads, either side, or a select's flag.
    unit_groups = (
        eq(rank_of(m)).to(i64(5)),
        eq(dim_of(m, i64(1))).to(String(ONE)),
        eq(dim_of(m, i64(2))).to(String(ONE)),
    )
    heads_mask = Tensor.ungroup_heads(m, ONE)
    yield rule(*unit_groups).then(
        head_invariant(heads_mask),
        set_(rank_of(heads_mask)).to(i64(4)),
        union(heads_mask).with_(Tensor.squeeze(m, i64(-3))),  # what a target writes: the unit G axis dropped
    )
    for binary in BINARY:
        yield rewrite(binary(Tensor.group_heads(x, g), m)).to(
            Tensor.group_heads(binary(x, heads_mask), g), *unit_groups
        )
        yield rewrite(binary(m, Tensor.group_heads(x, g))).to(
            Tensor.group_heads(binary(heads_mask, x), g), *unit_groups
        )
    for select, grouped in (
        (Tensor.where(m, Tensor.group_heads(x, g), c), Tensor.where(heads_mask, x, c)),
        (Tensor.where(m, c, Tensor.group_heads(x, g)), Tensor.where(heads_mask, c, x)),
    ):
        yield rewrite(select).to(Tensor.group_heads(grouped, g), *unit_groups, scalar_of(c) == f)
    # … inward through ungroup_heads, so a mask's flag and its scalars are read as the other families expect.
    yield rewrite(Tensor.ungroup_heads(Tensor.cast(x, r), g)).to(Tensor.cast(Tensor.ungroup_heads(x, g), r))
    for binary in BINARY:
        yield rewrite(Tensor.ungroup_heads(binary(x, c), g)).to(
            binary(Tensor.ungroup_heads(x, g), c), scalar_of(c) == f
        )
        yield rewrite(Tensor.ungroup_heads(binary(c, x), g)).to(
            binary(c, Tensor.ungroup_heads(x, g)), scalar_of(c) == f
        )
    # Facts through the views: a finite mask stays finite.
    for view in (
        lambda t: Tensor.group_heads(t, g),
        lambda t: Tensor.ungroup_heads(t, g),
        lambda t: Tensor.fold_groups(t, k, g),
        lambda t: Tensor.unfold_groups(t, k, g),
    ):
        yield rule(view(x), finite(x)).then(finite(view(x)))
