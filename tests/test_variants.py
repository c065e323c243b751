"""Each spelling choice exporters make, one at a time, on a self-attention block built by egfuse.testing:
all land in one fused op, for both targets, with the original's numerics."""

from __future__ import annotations

import dataclasses

import pytest

import egfuse
from egfuse.testing import K_LAYOUTS, MASKS, SCALES, Variant, attention_model, feeds_for

from .conftest import assert_same_outputs, fused_op_count

BASE = Variant()
ONE_AT_A_TIME = (
    [("scale", s) for s in SCALES]
    + [("k_layout", k) for k in K_LAYOUTS]
    + [("mask", m) for m in MASKS]
    + [
        ("guard", True),
        ("commuted", True),
        ("proj_bias", False),
        ("symbolic", False),
        ("heads", 1),
        ("head_dim", 64),
    ]
)


@pytest.mark.parametrize(("field", "value"), ONE_AT_A_TIME, ids=[f"{f}={v}" for f, v in ONE_AT_A_TIME])
def test_spelling_fuses(field, value, target):
    variant = dataclasses.replace(BASE, **{field: value})
    model = attention_model(variant)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1, str(result.report)
    assert result.report.validated is True
    assert fused_op_count(result.model, target) == 1
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=5, batch=3, seq=4))


def test_custom_scale_is_kept(target):
    model = attention_model(dataclasses.replace(BASE, scale="custom"))
    result = egfuse.fuse(model, target=target)
    scales = [a.f for n in result.model.graph.node for a in n.attribute if a.name == "scale"]
    assert scales == [pytest.approx(0.3)]


def test_no_scale_gives_scale_one(target):
    model = attention_model(dataclasses.replace(BASE, scale="none"))
    result = egfuse.fuse(model, target=target)
    scales = [a.f for n in result.model.graph.node for a in n.attribute if a.name == "scale"]
    assert scales == [pytest.approx(1.0)]


def test_report_names_the_variant():
    model = attention_model(dataclasses.replace(BASE, scale="split_sqrt", mask="where_finfo", guard=True))
    region = egfuse.fuse(model).report.regions[0]
    assert region.variants["scale"] == "Q (Mul) and K (Mul)"
    assert region.variants["mask"].startswith("select (Where")
    assert region.variants["guard"] == "Where(IsNaN)"
