"""Feeds for graphs whose input dims are related in ways their names do not say (the dynamo exporter names a
KV-cache model's mask length ``s53``, which must be past + new length): validation finds a binding the
original runs on instead of giving up, and the fused model is proven on it."""

from __future__ import annotations

import egfuse
from egfuse.testing import Variant, attention_model, feeds_for
from egfuse.validation import inputs, validate

from ..conftest import assert_same_outputs


def _with_opaque_total(variant: Variant):
    """The variant's model with the mask length renamed to a symbol that says nothing about past + new."""
    model = attention_model(variant)
    for inp in model.graph.input:
        for d in inp.type.tensor_type.shape.dim:
            if d.dim_param == "total_seq":
                d.dim_param = "s53"
    return model


def test_independent_sizes_do_not_run_the_original():
    model = _with_opaque_total(Variant(past=True, mask="padding_int", k_layout="transpose_0132"))
    try:
        validate.run(model, validate.make_feeds(model))
    except Exception:
        return
    raise AssertionError("the original ran on independent sizes: the test no longer exercises related dims")


def test_a_related_binding_is_found_and_the_cache_model_fuses():
    variant = Variant(past=True, mask="padding_int", k_layout="transpose_0132", causal="trilu")
    model = _with_opaque_total(variant)
    for target in ("ort", "onnx"):
        result = egfuse.fuse(model, target=target)
        assert result.report.fused == 1 and result.report.validated is True, str(result.report)
        assert_same_outputs(model, result.model, feeds_for(attention_model(variant), left_padding=True))


def test_a_binding_is_never_invented_for_the_users_feeds():
    """Given feeds the original cannot run on, nothing is applied and no other binding is tried."""
    model = _with_opaque_total(Variant(past=True, mask="padding_int", k_layout="transpose_0132"))
    result = egfuse.fuse(model, target="onnx", feeds=validate.make_feeds(model))
    assert result.report.fused == 0 and result.report.validated is None, str(result.report)


def test_cache_tensors_named_apart_are_bound_alike():
    """torch's dynamo exporter names each cache tensor's length apart (``s13`` for the keys, ``s9`` for the
    values) though attention needs them equal: alike inputs bound to one size are tried first."""
    variant = Variant(past=True, mask="padding_int", k_layout="transpose_0132")
    model = _with_opaque_total(variant)
    (value_length,) = [d for d in model.graph.input[1].type.tensor_type.shape.dim if d.dim_param == "past_seq"]
    value_length.dim_param = "s9"
    (first, *_) = inputs.related_bindings(model)
    assert first["s9"] == first["past_seq"], first
    for target in ("ort", "onnx"):
        result = egfuse.fuse(model, target=target)
        assert result.report.fused == 1 and result.report.validated is True, str(result.report)
        assert_same_outputs(model, result.model, feeds_for(attention_model(variant), left_padding=True))


def test_failed_runs_print_nothing(capfd):
    """onnxruntime's own error log (red, on stderr) never reaches the terminal: a failed run's message goes into
    the report instead — here the original's runs fail on independent sizes, then on the user's feeds."""
    model = _with_opaque_total(Variant(past=True, mask="padding_int", k_layout="transpose_0132"))
    egfuse.fuse(model, target="onnx")
    result = egfuse.fuse(model, target="onnx", feeds=validate.make_feeds(model))
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert "does not run on the given feeds" in result.report.validation_note


def test_what_cannot_be_proven_is_kept_at_once_with_the_reason(monkeypatch):
    """Where the original itself does not run, no region can be proven in any form: every one is kept in the
    first round with that reason (the targets with a second form once tried it, and their report said "no fused
    form validated")."""
    import egfuse.fixpoint

    searches = []
    search = egfuse.fixpoint.fuse_once
    monkeypatch.setattr(egfuse.fixpoint, "fuse_once", lambda *a, **k: searches.append(1) or search(*a, **k))
    model = _with_opaque_total(Variant(past=True, mask="padding_int", k_layout="transpose_0132"))
    for target in ("npu", "ort", "onnx"):
        searches.clear()
        result = egfuse.fuse(model, target=target, feeds=validate.make_feeds(model))
        reasons = {r.reason for r in result.report.regions}
        assert reasons == {"not validated (the original does not run on the given feeds)"}, (target, reasons)
        assert result.report.validated is None and len(searches) == 2, (target, len(searches))
