"""Validation must catch injected faults: every fault kind of ``experiments/validation_mutations.py`` on a few
block spellings and both fused targets is caught by egfuse's own judge (generated feeds, masks exercised)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import egfuse
from egfuse import validate
from egfuse.testing import Variant, attention_model

_PATH = Path(__file__).resolve().parents[1] / "experiments" / "validation_mutations.py"
_spec = importlib.util.spec_from_file_location("validation_mutations", _PATH)
mutations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutations)

BASES = ["encoder, padding", "int padding mask", "gqa, causal", "kv cache", "rope"]


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("base", BASES)
def test_every_injected_fault_is_caught(base: str, target: str):
    original = attention_model(mutations.BASES[base])
    result = egfuse.fuse(original, target=target)
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    tried = 0
    for kind, fault in mutations.FAULTS.items():
        if kind == "fully masked rows changed" and (
            mutations.BASES[base].causal == "none" or mutations.BASES[base].past
        ):
            continue  # seen only where a causal mask and left padding hide every key of a query (no cache before)
        outcome = mutations.trial(original, result, fault)
        if outcome is None:
            continue
        tried += 1
        assert outcome["caught"], f"{kind} not caught on {base} / {target}"
    assert tried >= 15


def test_masks_are_exercised_beyond_one_padded_position():
    """The feeds that exercise masks pad half the keys of a row on either side and draw random masks; a float
    mask also gets the additive convention (0 and finfo.min)."""
    model = attention_model(Variant(heads=2))
    base = validate.make_feeds(model)
    sets = validate.mask_feed_sets(base)
    assert set(sets) == {"heavy padding", "random masks", "additive padding"}
    heavy = sets["heavy padding"]["mask"]
    assert (heavy[0, ..., : heavy.shape[-1] // 2] == 0).all() and (heavy[-1, ..., -(heavy.shape[-1] // 2) :] == 0).all()
    assert np.isin(sets["additive padding"]["mask"], [0.0, np.finfo(np.float32).min]).all()
    assert all((m[..., 0] == 1).all() for m in (sets["random masks"]["mask"],))  # every row keeps a key
