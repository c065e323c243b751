"""A half-precision model's large-scores feeds are drawn four times, the later draws with random signs and
four times larger again: in half precision ``S + finfo.min`` overflows to −inf once S < −16, so what a fully
masked row computes turns on the sign of the scores it hides. One draw let a fused op that makes such a row
non-finite through about three times in four (a padding mask beside a causal fill, GQA, RoPE: the fused
``Attention`` gave inf where the graph's row is finite on half of an independent judge's seeds)."""

from __future__ import annotations

import numpy as np

import egfuse
from egfuse.testing import Variant, attention_model, disagreements, feeds_for
from egfuse.validation import validate
from egfuse.validation.inputs import HALF_LARGE_DRAWS, LARGE_SCORES


def test_half_precision_models_get_redrawn_large_scores_and_float32_ones_do_not():
    half = validate.make_feeds(attention_model(Variant(heads=2, dtype="float16")))
    single = validate.make_feeds(attention_model(Variant(heads=2)))
    half_sets, single_sets = validate.mask_feed_sets(half), validate.mask_feed_sets(single)
    large = [label for label in half_sets if label.startswith(LARGE_SCORES)]
    assert len(large) == HALF_LARGE_DRAWS >= 2
    assert [label for label in single_sets if label.startswith(LARGE_SCORES)] == [LARGE_SCORES]
    first = half_sets[LARGE_SCORES]["x"].astype(np.float32)
    for label in large[1:]:
        drawn = half_sets[label]
        assert np.array_equal(drawn["mask"], half_sets[LARGE_SCORES]["mask"])  # the same most masked keys
        ratio = np.abs(drawn["x"].astype(np.float32)) / np.maximum(np.abs(first), 1e-3)
        assert np.allclose(ratio[np.abs(first) > 1e-2], 4.0, rtol=1e-2)  # four times larger again
        assert (np.sign(drawn["x"]) != np.sign(first)).any()  # and signs drawn afresh


def test_a_half_precision_block_is_not_fused_into_a_non_finite_fully_masked_row():
    variant = Variant(
        k_layout="transpose_0132", mask="additive_first", guard=True, commuted=True, heads=4, head_dim=64,
        symbolic=False, causal="range_greater", kv_heads=2, dtype="float16", rope=True, rope_partial=True,
        concat="sequence", einsum=True, seed=51205,
    )  # fmt: skip
    model = attention_model(variant)
    result = egfuse.fuse(model, target="ort")
    for seed in range(6):  # the judge's own feeds, not validation's
        feeds = feeds_for(model, seed=seed, batch=3, seq=6, left_padding=True)
        assert disagreements(model, result.model, feeds) == [], seed
