"""The fixpoint of search and judge, in one place: search (:mod:`egfuse.search`), judge on onnxruntime
(:mod:`egfuse.validation.judge`), roll back what differs (or give it its next form) and search again, for at most
:data:`~egfuse.validation.judge.VALIDATION_ROUNDS` rounds; unproven after the last, nothing is applied.

A large model goes through it as a skeleton, its weights kept apart (:mod:`egfuse.files.protos`); a model that needs
the standard ``Attention`` op's opset is raised to it and searched again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import onnx

from egfuse.analysis.dims import integer_text_dims
from egfuse.errors import EgfuseError
from egfuse.files import protos
from egfuse.files.load import LoadedModel
from egfuse.preparation.prepare import (
    admit_standard_attention,
    bump_opset,
    needs_standard_opset,
    prepare,
    same_nodes,
)
from egfuse.preparation.shape_inference import infer_shapes
from egfuse.report import RegionKey, Report, Status
from egfuse.search import Budgets, fuse_once
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, TargetSpec
from egfuse.validation.ahead import ahead
from egfuse.validation.judge import VALIDATION_ROUNDS, ban_forms, judge, upstream_only
from egfuse.validation.runner import precomputed

__all__ = ["fuse_loaded"]


def fuse_loaded(
    loaded: LoadedModel,
    chosen: TargetSpec,
    validate: bool,
    feeds: dict | None,
    budgets: Budgets,
    origins: dict[str, str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """One model through the stages; ``origins`` maps inlined node names to the functions they came from."""
    if loaded.weights_folder is not None:  # the weights are in the user's files, and stay there
        weights = protos.DetachedWeights.kept_in(loaded.proto, loaded.weights_folder)
        fused_proto, report = _fuse(loaded, chosen, validate, feeds, budgets, weights, origins)
    elif protos.weight_bytes(loaded.proto) <= protos.DETACH_BYTES:
        fused_proto, report = _fuse(loaded, chosen, validate, feeds, budgets, None, origins)
    else:  # every stage on the graph without its weights; the weights come back into the result alone
        with protos.DetachedWeights(loaded.proto) as weights:
            skeleton = replace(loaded, proto=weights.skeleton)
            fused_proto, report = _fuse(skeleton, chosen, validate, feeds, budgets, weights, origins)
            fused_proto = weights.restore(fused_proto) if report.changed else loaded.proto
        if weights.lifted and report.changed:
            report.notes.append(
                f"{weights.lifted} large Constant values are initializers in the result (the same values: egfuse "
                "keeps weights outside the graph while it works, and only initializers can be stored there)"
            )
    return fused_proto, report


def _fuse(
    loaded: LoadedModel,
    chosen: TargetSpec,
    validate: bool,
    feeds: dict | None,
    budgets: Budgets,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """The stages in order; ``weights`` holds a large model's weights apart from ``loaded``'s skeleton."""
    original = loaded.proto
    prepared, prepare_note = prepare(loaded, chosen, validate)
    excluded: dict[RegionKey, tuple[str, float]] = {}
    banned: dict[RegionKey, dict[str, str]] = {}  # region → forms that did not validate there, and why
    with ahead(original, feeds, budgets.validation_bytes, validate=validate, weights=weights) as early:
        search_once = partial(
            fuse_once,
            budgets=budgets,
            excluded=excluded,
            banned=banned,
            source=loaded.source,
            weights=weights,
            origins=origins,
            on_found=early.start,  # the original's runs start beside the search once its regions are known
        )
        prepared, chosen, fused_proto, report, opset_note = _searched(loaded, prepared, chosen, search_once)
        if validate and report.changed:
            t0 = time.perf_counter()
            with precomputed(early.precomputed()):
                fused_proto, report = _judged_rounds(original, prepared, chosen, fused_proto, report, search_once,
                                                     feeds, weights, budgets, excluded, banned)  # fmt: skip
            report.stats["seconds_validate"] = time.perf_counter() - t0
        elif validate:
            report.validated = None
            report.validation_note = "nothing was fused, so the model is unchanged"
    if prepare_note:
        report.validation_note = f"{report.validation_note}; {prepare_note}" if report.validation_note else prepare_note
        if not report.validated and report.changed:
            raise EgfuseError(
                "the opset bump needed for the standard Attention op did not validate; use --target ort",
                path=loaded.source,
            )
    if opset_note and report.changed:
        report.notes.append(opset_note)
    if not report.changed:
        fused_proto = original  # nothing to gain: hand back the model exactly as it came
    return fused_proto, report


def _searched(
    loaded: LoadedModel, prepared: onnx.ModelProto, chosen: TargetSpec, search_once: Callable
) -> tuple[onnx.ModelProto, TargetSpec, onnx.ModelProto, Report, str | None]:
    """The first search, and — where what it wrote needs the standard ``Attention`` op's opset — the model
    raised to that opset and searched again (or only renumbered, where the conversion changed no node):
    (prepared, target, fused, report, the opset note)."""
    fused_proto, report = search_once(prepared, chosen)
    opset_note = None
    if needs_standard_opset(prepared, fused_proto):
        converted, chosen, opset_note = admit_standard_attention(loaded, prepared, chosen)
        if converted is not None and same_nodes(converted, loaded.proto):
            # The conversion only renumbered the opset: what was fused stands, under the new number.
            prepared = bump_opset(prepared, STANDARD_ATTENTION_OPSET)
            fused_proto.ir_version = prepared.ir_version = max(prepared.ir_version, converted.ir_version)
        else:
            prepared = infer_shapes(integer_text_dims(converted)) if converted is not None else prepared
            fused_proto, report = search_once(prepared, chosen)
    return prepared, chosen, fused_proto, report, opset_note


def _judged_rounds(
    original: onnx.ModelProto,
    prepared: onnx.ModelProto,
    chosen: TargetSpec,
    fused_proto: onnx.ModelProto,
    report: Report,
    search_once: Callable,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
    budgets: Budgets,
    excluded: dict,
    banned: dict,
) -> tuple[onnx.ModelProto, Report]:
    """The fixpoint of search and judge: what does not validate is rolled back (or given its next form) and
    the search runs again, for at most :data:`VALIDATION_ROUNDS` rounds; unproven after the last, nothing is
    applied."""
    for round_ in range(VALIDATION_ROUNDS):
        verdict = judge(original, fused_proto, report, feeds, weights, budgets.validation_bytes)
        verdict.record(report)
        failing = verdict.failing
        if not failing:
            return fused_proto, report
        note = report.validation_note
        if verdict.validated is None:  # nothing could be proven (the original does not run, or over the memory
            excluded.update(failing)  # budget): no other form, and no region alone, would be proven either
        else:
            if round_ < VALIDATION_ROUNDS - 1:
                failing = upstream_only(failing, fused_proto, report)
            excluded.update(ban_forms(failing, report, banned))
        fused_proto, report = search_once(prepared, chosen)
        if not report.changed:
            report.validated, report.validation_note = None, note
            return fused_proto, report
    # Unproven after every round: change nothing.
    verdict = judge(original, fused_proto, report, feeds, weights, budgets.validation_bytes)
    verdict.record(report)
    if verdict.failing:
        report.validated = None
        report.validation_note = f"nothing applied: validation still failed after {VALIDATION_ROUNDS} rounds"
        for entry in report.entries():
            if entry.status == Status.FUSED:
                entry.status, entry.reason = Status.ROLLED_BACK, "validation did not settle"
        fused_proto = original
    return fused_proto, report
