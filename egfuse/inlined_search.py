"""Models that call model-local functions (dynamo exports): searched with every function inlined, then only the
functions that held what fused are inlined in the result, so every other function stays as written.

When the graph egfuse made by inlining is what does not run, the report says so instead of blaming the model
or the feeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import onnx

from egfuse.files import protos
from egfuse.files.load import LoadedModel
from egfuse.preparation import functions
from egfuse.report import Report, Status
from egfuse.validation import runner
from egfuse.validation import validate as validate_
from egfuse.validation.judge import short

__all__ = ["fuse_through_functions", "kept_weights", "unloadable_note"]

FuseLoaded = Callable[..., tuple[onnx.ModelProto, Report]]
"""One loaded model through the stages (:func:`egfuse.fixpoint.fuse_loaded`): (model, target, validate, feeds,
budgets[, origins]) → (fused model, report)."""


def kept_weights(loaded: LoadedModel) -> protos.DetachedWeights | None:
    """The files a model read from a path keeps its weights in, for onnxruntime to map: None where inline."""
    folder = loaded.weights_folder
    return None if folder is None else protos.DetachedWeights.kept_in(loaded.proto, folder)


def unloadable_note(loaded: LoadedModel, report: Report, searched: onnx.ModelProto) -> str | None:
    """Where onnx's checker rejected a model whose functions egfuse inlined and validated: whether onnxruntime
    loads the model as given. torch 2.4's dynamo exporter writes functions listing one output twice, which
    onnxruntime refuses at load; inlined (a call is its body, by ONNX's definition) the graph loads, and the
    fused model was proven against that graph — the report must say that it is not the model as given."""
    if not report.validated or searched is loaded.proto:
        return None
    try:
        runner.session(loaded.proto, kept_weights(loaded))
    except Exception as err:  # onnxruntime refuses the model as written
        return (
            f"onnxruntime does not load the model as given ({short(err)}); with its local functions inlined it "
            "does, and the fused model was validated against that inlined graph (a function call is its body)"
        )
    return None


def fuse_through_functions(
    fuse_loaded: FuseLoaded, loaded: LoadedModel, chosen, validate: bool, feeds: dict | None, budgets
) -> tuple[onnx.ModelProto, Report, onnx.ModelProto]:
    """Fuse a model whose graph calls model-local functions: search the fully inlined model, then inline only
    the functions that held what fused (and their callers), so every other function stays as written. The
    partial inlining must fuse as much as the full one did, or the fully inlined result is kept. Returns the
    result, its report and the model searched (all functions inlined)."""
    try:
        full = functions.inline(loaded.proto)
    except Exception as err:  # onnx-ir refuses cycles, opset clashes, graph-valued attributes: search the graph
        fused_proto, report = fuse_loaded(loaded, chosen, validate, feeds, budgets)
        report.notes.append(f"the model's local functions could not be inlined ({short(err)}): not searched")
        return fused_proto, report, loaded.proto
    fused_proto, report = fuse_loaded(replace(loaded, proto=full.proto), chosen, validate, feeds, budgets, full.origins)
    _blame_the_inlining(loaded, feeds, report)
    total = len(full.inlined)
    if not report.changed:
        report.functions = {"inlined": [], "kept": full.inlined}
        report.notes.append(
            f"the model's {total} local functions were inlined to look for attention; nothing fused, so the model "
            "is returned as it came, functions and all"
        )
        return loaded.proto, report, full.proto
    needed = {label for r in report.entries() if r.status == Status.FUSED for label in r.functions}
    partial = functions.inline(loaded.proto, only=needed)
    spared = set(partial.kept) - set(full.kept)  # called functions the partial inlining keeps
    why_all = "every function holds fused attention or calls one that does"
    if spared:
        proto2, report2 = fuse_loaded(
            replace(loaded, proto=partial.proto), chosen, validate, feeds, budgets, partial.origins
        )
        if _outcome(report2) == _outcome(report):
            # Regions of the first search that stayed inside kept functions: the second never saw them.
            for r in report.regions:
                if r.status != Status.FUSED and r.functions and set(r.functions) <= spared:
                    r.index = len(report2.regions)
                    r.notes.append(f"inside function {r.functions[0]}, kept as a function")
                    report2.regions.append(r)
            report2.functions = {"inlined": partial.inlined, "kept": sorted(spared)}
            report2.notes.append(
                f"{len(partial.inlined)} of the model's {total} local functions were inlined (those holding fused "
                f"attention and their callers); {len(spared)} kept as functions"
            )
            return proto2, report2, full.proto
        why_all = (
            "keeping the others as functions did not fuse and validate the same ("
            + (report2.validation_note or f"fused, validated, rotations: {_outcome(report2)}, not {_outcome(report)}")
            + ")"
        )
    report.functions = {"inlined": full.inlined, "kept": []}
    report.notes.append(f"all {total} of the model's local functions were inlined: {why_all}")
    return fused_proto, report, full.proto


def _blame_the_inlining(loaded: LoadedModel, feeds: dict | None, report: Report) -> None:
    """Where validation found that "the original" — the inlined graph egfuse searched — does not load or run,
    ask the model as the user gave it: if that runs, the fault is egfuse's inlining, and the report says so
    instead of blaming the model or the feeds (the model is returned unchanged either way)."""
    note = report.validation_note or ""
    if report.validated is not None or not note.startswith("nothing applied: the original model does not"):
        return
    try:
        validate_.original_outputs(loaded.proto, feeds, [], weights=kept_weights(loaded))
    except Exception:  # the model itself does not run: the note stands
        return
    cause = note.split("(", 1)[1].rsplit(")", 1)[0] if "(" in note else note
    report.validation_note = (
        "nothing applied: the graph egfuse made by inlining the model's local functions does not run on "
        f"onnxruntime ({cause}), although the model as given does — a fault in egfuse's inlining, not in the "
        "model or the inputs; the model is returned as it came (please report it, with the model)"
    )
    reason = "not validated (egfuse's inlined graph does not run; the model as given does)"
    for entry in report.entries():
        blamed_feeds = (entry.reason or "").startswith("not validated (the original does not")
        if entry.status == Status.ROLLED_BACK and blamed_feeds:
            entry.reason = reason


def _outcome(report: Report) -> tuple:
    """What a partial inlining must reproduce: as many regions and rotations fused, validated alike."""
    return report.fused, report.validated, sum(r.status == Status.FUSED for r in report.rotary)
