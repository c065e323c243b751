"""Terms for Reshapes that view attention heads in groups: grouped-query attention written one group of query
heads at a time (Keras' einsum ``btkgh,bskh->bkgts`` as tf2onnx lowers it) — the heads viewed as
(B, K, G, T, X) (``group_heads``) or packed as the rows of a (B·K, G·T, X) batch (``fold_groups``). The identities
that make them attention are in ``rules/groups.py``."""

from __future__ import annotations

from collections.abc import Iterator

from egfuse.analysis.dims import Dim
from egfuse.lowering.lower_terms import TermWriter, quoted, times


class GroupTerms(TermWriter):
    def _grouped(self, arg: str, src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> str | None:
        """Reshapes that view the heads in groups (grouped-query attention written per group: Keras' einsum
        ``btkgh,bskh->bkgts`` as tf2onnx lowers it), each as the grouping of (B, N, T, X) heads it performs.
        The number of KV heads K and the group size G must be numbers: the terms name them. Unit dims can make
        two readings true (a unit axis is both a group of one and one group): every true one is stated."""
        return self._one_class(*self._groupings(arg, src, dst))

    def _groupings(self, arg: str, src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> Iterator[str]:
        """Each reading of the Reshape from ``src`` to ``dst`` as grouped heads that holds."""
        ranks = (len(src), len(dst))
        if ranks == (4, 5) and dst[0] == src[0] and dst[3:] == src[2:] and _grouping(src[1], dst[1], dst[2]):
            # (B, N, T, X) → (B, K, G, T, X): the heads axis in K groups of G
            yield self._call("group_heads", arg, quoted(dst[2]))
        if ranks == (5, 4) and dst[0] == src[0] and dst[2:] == src[3:] and _grouping(dst[1], src[1], src[2]):
            # (B, K, G, T, X) → (B, N, T, X): the groups joined
            yield self._call("ungroup_heads", arg, quoted(src[2]))
        if ranks == (4, 5) and dst[:2] == src[:2] and dst[4] == src[3] and _grouping(src[2], dst[2], dst[3]):
            # (B, T, N, H) → (B, T, K, G, H): the heads of a (B, S, N, H) tensor split into K groups of G
            grouped = self._call("group_heads", self._call("transpose", arg, quoted("0,2,1,3")), quoted(dst[3]))
            yield self._call("transpose", grouped, quoted("0,3,1,2,4"))
        if ranks == (5, 4) and dst[:2] == src[:2] and dst[3] == src[4] and _grouping(dst[2], src[2], src[3]):
            # (B, T, K, G, H) → (B, T, N, H): the groups joined again
            heads = self._call("ungroup_heads", self._call("transpose", arg, quoted("0,2,3,1,4")), quoted(src[3]))
            yield self._call("transpose", heads, quoted("0,2,1,3"))
        if ranks == (5, 3) and src[4] == dst[2] and _folded(dst[:2], src[:4]):
            # (B, K, G, T, X) → (B·K, G·T, X): each group's heads stacked as rows of one batch entry
            heads = self._call("ungroup_heads", arg, quoted(src[2]))
            yield self._call("fold_groups", heads, quoted(src[1]), quoted(src[2]))
        if ranks == (3, 5) and src[2] == dst[4] and _folded(src[:2], dst[:4]):
            # (B·K, G·T, X) → (B, K, G, T, X): the rows of each batch entry back to its group of heads
            heads = self._call("unfold_groups", arg, quoted(dst[1]), quoted(dst[2]))
            yield self._call("group_heads", heads, quoted(dst[2]))


def _grouping(heads: Dim, kv_heads: Dim, group: Dim) -> bool:
    """``heads`` is ``kv_heads`` groups of ``group``, both numbers."""
    return None not in (kv_heads.static, group.static) and times(kv_heads, group) == heads


def _folded(merged: tuple[Dim, ...], grouped: tuple[Dim, ...]) -> bool:
    """(B·K, G·T) ``merged`` from (B, K, G, T) ``grouped``, K and G numbers."""
    batch, kv_heads, group, rows = grouped
    return (
        None not in (kv_heads.static, group.static)
        and times(batch, kv_heads) == merged[0]
        and times(group, rows) == merged[1]
    )
