"""``fuse()``: the one place that knows the order of the stages; each stage is a module of its own.

load (:mod:`~egfuse.load`) → prepare (:mod:`~egfuse.prepare`: opset, shapes) → search (:mod:`~egfuse.search`:
facts, rotations, regions, lower, saturate, extract, raise) → judge (:mod:`~egfuse.judge`: validate on
onnxruntime) → report; :mod:`~egfuse.save` writes the result.
A region or rotation whose fused outputs disagree with the original on onnxruntime is rolled back (the
pipeline is re-run with it excluded; the ones nothing else that differs feeds go first) and the report says by
how much it was off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import onnx
import onnx_ir as ir

from egfuse import functions, progress, protos, runner, well_formed
from egfuse import validate as validate_  # ``validate`` is fuse()'s switch
from egfuse.dims import integer_text_dims
from egfuse.errors import EgfuseError, FeedsError
from egfuse.judge import VALIDATION_ROUNDS, ban_forms, judge, short, upstream_only
from egfuse.load import LoadedModel, ModelLike, load
from egfuse.outputs import model_inputs
from egfuse.prepare import admit_standard_attention, bump_opset, infer_shapes, needs_standard_opset, prepare, same_nodes
from egfuse.report import Report, Status
from egfuse.save import save_model
from egfuse.search import Budgets, RegionKey, fuse_once
from egfuse.targets import for_provider, get_target
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, TargetSpec
from egfuse.version import __version__

__all__ = ["Budgets", "FuseResult", "fuse", "infer_shapes", "save_model"]


@dataclass
class FuseResult:
    _model: onnx.ModelProto
    report: Report
    _source_external: bool = field(default=False, repr=False)
    """The input kept its weights outside the .onnx file (the result keeps only this of the input: holding the
    input itself would keep a second copy of a large model's weights alive as long as the result)."""
    _inputs: tuple[Path, ...] = field(default=(), repr=False)
    """The files the input was read from (the model, its weights): a save never writes over them."""
    _weights_folder: Path | None = field(default=None, repr=False)
    """Where the result's large tensors still are (the input's own files): read by :attr:`model` on first use,
    streamed from there by :meth:`save`."""

    @property
    def model(self) -> onnx.ModelProto:
        """The fused model, its weights inline. A model whose weights stayed in their files while egfuse worked
        reads them here, once: :meth:`save` does not need to (it streams them into the new weights file)."""
        if self._weights_folder is not None:
            protos.DetachedWeights.kept_in(self._model, self._weights_folder).restore(self._model)
            self._weights_folder = None
        return self._model

    def save(self, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
        """Write atomically: a crash leaves the old model (and weights) at ``path`` or the new, never half of
        one nor a mix (see :mod:`egfuse.save`). Weights go to a file beside it, ``<name>.data`` unless that name
        is taken, when the input kept them external (or when asked, or past protobuf's 2 GB). Refuses (an
        :class:`~egfuse.errors.UnsafeOutputError`, nothing written) a path that is an input file or not a
        regular file."""
        if external_data is None and self._source_external:
            external_data = True
        streamed = self._weights_folder is not None and external_data is not False
        save_model(
            self._model if streamed else self.model,
            Path(path),
            external_data=external_data,
            inputs=model_inputs(self._inputs),
            weights_folder=self._weights_folder if streamed else None,
        )

    def to_ir(self) -> ir.Model:
        return ir.serde.deserialize_model(self.model)


def fuse(
    model: ModelLike,
    target: str | TargetSpec = "ort",
    validate: bool = True,
    *,
    feeds: dict | None = None,
    budgets: Budgets | None = None,
    shapes: dict[str, int] | None = None,
    rotary: bool = True,
    raise_opset: bool = True,
    validation: validate_.Settings | None = None,
) -> FuseResult:
    """Fuse every attention block of ``model`` for ``target`` (``egfuse.targets()`` lists them), proven on
    onnxruntime. ``shapes`` binds symbolic dims (a symbol, or a word in it: ``{"seq": 512, "past": 1024}``) to
    the sizes the cost model should choose the fastest form for. ``rotary=False`` leaves RoPE as the graph
    wrote it; ``raise_opset=False`` keeps the model's opset (``ort`` then writes only its contrib ops, and a
    target that needs opset 23 is refused); ``validation`` sets the tolerances and execution providers."""
    start = time.perf_counter()
    named = get_target(target)  # fail early on an unknown name
    providers = (validation or validate_.DEFAULTS).providers
    chosen = for_provider(named, providers)
    priced = chosen is not named  # another provider's costs
    if shapes is not None:
        chosen = chosen.for_shapes(shapes)
    if not rotary:
        chosen = replace(chosen, no_rotary="RoPE fusion turned off (rotary=False / --no-rope)")
    progress.stage("loading the model")
    loaded = load(model)
    if not raise_opset and loaded.opset < STANDARD_ATTENTION_OPSET:
        if chosen.requires_standard_opset:
            raise EgfuseError(
                f"target {chosen.name!r} writes opset-{STANDARD_ATTENTION_OPSET} ops and the opset may not be raised "
                f"(raise_opset=False / --keep-opset); the model is at opset {loaded.opset}: use --target ort",
                path=loaded.source,
            )
        kept = "RotaryEmbedding needs opset 23 and the model's opset is kept (raise_opset=False / --keep-opset)"
        chosen = replace(chosen.below_opset(loaded.opset), no_rotary=chosen.no_rotary or kept)
    if feeds is not None and validate:
        _check_feed_names(feeds, loaded)
    checker_note = well_formed.checker_note(loaded.proto)
    budgets = budgets or Budgets()
    searched = loaded.proto
    with validate_.using(validation):
        if functions.calls_local_functions(loaded.proto):
            fused_proto, report, searched = _fuse_through_functions(loaded, chosen, validate, feeds, budgets)
        else:
            fused_proto, report = _fuse_loaded(loaded, chosen, validate, feeds, budgets)
    examined = {r.softmax for r in report.regions}  # If branches on known conditions were folded into the graph
    report.unexamined = [u for u in functions.softmaxes_in_subgraphs(searched) if u.split(": ")[-1] not in examined]
    if checker_note:
        report.notes.append(_unloadable_note(loaded, report, searched) or checker_note)
    report.notes.extend(_provider_notes(priced, providers))
    report.stats["seconds_total"] = time.perf_counter() - start
    if report.changed:
        _sign(fused_proto)
    return FuseResult(fused_proto, report, loaded.external_data, loaded.files, loaded.weights_folder)


def _kept_weights(loaded: LoadedModel) -> protos.DetachedWeights | None:
    """The files a model read from a path keeps its weights in, for onnxruntime to map: None where inline."""
    folder = loaded.weights_folder
    return None if folder is None else protos.DetachedWeights.kept_in(loaded.proto, folder)


def _unloadable_note(loaded: LoadedModel, report: Report, searched: onnx.ModelProto) -> str | None:
    """Where onnx's checker rejected a model whose functions egfuse inlined and validated: whether onnxruntime
    loads the model as given. torch 2.4's dynamo exporter writes functions listing one output twice, which
    onnxruntime refuses at load; inlined (a call is its body, by ONNX's definition) the graph loads, and the
    fused model was proven against that graph — the report must say that it is not the model as given."""
    if not report.validated or searched is loaded.proto:
        return None
    try:
        runner.session(loaded.proto, _kept_weights(loaded))
    except Exception as err:  # onnxruntime refuses the model as written
        return (
            f"onnxruntime does not load the model as given ({short(err)}); with its local functions inlined it "
            "does, and the fused model was validated against that inlined graph (a function call is its body)"
        )
    return None


def _provider_notes(priced: bool, providers: tuple[str, ...]) -> list[str]:
    """What the report says of the execution providers asked for: whose costs chose the forms, and where
    validation ran when a provider named is not in this onnxruntime."""
    notes = []
    if priced:
        notes.append(f"forms chosen by {providers[0]}'s measured costs (--provider)")
    ran = validate_.available(providers)
    missing = [p for p in providers if p not in ran]
    if missing:
        notes.append(f"validated on {', '.join(ran)}: {', '.join(missing)} is not in this onnxruntime")
    return notes


def _check_feed_names(feeds: dict, loaded: LoadedModel) -> None:
    """The user's feeds name the model's inputs, every one: a misspelt name would otherwise surface as "the
    original does not run on the given feeds" after the whole search."""
    initialized = {t.name for t in loaded.proto.graph.initializer}
    expected = [i.name for i in loaded.proto.graph.input if i.name not in initialized]
    unknown = sorted(set(feeds) - {i.name for i in loaded.proto.graph.input})
    missing = [name for name in expected if name not in feeds]
    if unknown or missing:
        what = "; ".join(
            part
            for part in (
                unknown and f"not inputs of the model: {', '.join(unknown)}",
                missing and f"missing: {', '.join(missing)}",
            )
            if part
        )
        raise FeedsError(
            f"the feeds do not match the model's inputs ({what}); it takes: {', '.join(expected)}", path=loaded.source
        )


def _sign(proto: onnx.ModelProto) -> None:
    """The fused model says what wrote it (``producer_name``/``producer_version``); the exporter that made
    the original is kept in ``metadata_props`` (``egfuse.source_producer``)."""
    source = " ".join(p for p in (proto.producer_name, proto.producer_version) if p)
    if source and not any(p.key == "egfuse.source_producer" for p in proto.metadata_props):
        proto.metadata_props.add(key="egfuse.source_producer", value=source)
    proto.producer_name, proto.producer_version = "egfuse", __version__


def _fuse_through_functions(
    loaded: LoadedModel, chosen: TargetSpec, validate: bool, feeds: dict | None, budgets: Budgets
) -> tuple[onnx.ModelProto, Report, onnx.ModelProto]:
    """Fuse a model whose graph calls model-local functions: search the fully inlined model, then inline only
    the functions that held what fused (and their callers), so every other function stays as written. The
    partial inlining must fuse as much as the full one did, or the fully inlined result is kept. Returns the
    result, its report and the model searched (all functions inlined)."""
    try:
        full = functions.inline(loaded.proto)
    except Exception as err:  # onnx-ir refuses cycles, opset clashes, graph-valued attributes: search the graph
        fused_proto, report = _fuse_loaded(loaded, chosen, validate, feeds, budgets)
        report.notes.append(f"the model's local functions could not be inlined ({short(err)}): not searched")
        return fused_proto, report, loaded.proto
    fused_proto, report = _fuse_loaded(
        replace(loaded, proto=full.proto), chosen, validate, feeds, budgets, full.origins
    )
    _blame_the_inlining(loaded, feeds, report)
    total = len(full.inlined)
    if not report.changed:
        report.functions = {"inlined": [], "kept": full.inlined}
        report.notes.append(
            f"the model's {total} local functions were inlined to look for attention; nothing fused, so the model "
            "is returned as it came, functions and all"
        )
        return loaded.proto, report, full.proto
    needed = {label for r in [*report.regions, *report.rotary] if r.status == Status.FUSED for label in r.functions}
    partial = functions.inline(loaded.proto, only=needed)
    spared = set(partial.kept) - set(full.kept)  # called functions the partial inlining keeps
    why_all = "every function holds fused attention or calls one that does"
    if spared:
        proto2, report2 = _fuse_loaded(
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
        validate_.original_outputs(loaded.proto, feeds, [], weights=_kept_weights(loaded))
    except Exception:  # the model itself does not run: the note stands
        return
    cause = note.split("(", 1)[1].rsplit(")", 1)[0] if "(" in note else note
    report.validation_note = (
        "nothing applied: the graph egfuse made by inlining the model's local functions does not run on "
        f"onnxruntime ({cause}), although the model as given does — a fault in egfuse's inlining, not in the "
        "model or the inputs; the model is returned as it came (please report it, with the model)"
    )
    reason = "not validated (egfuse's inlined graph does not run; the model as given does)"
    for entry in [*report.regions, *report.rotary, *report.layer_ops]:
        blamed_feeds = (entry.reason or "").startswith("not validated (the original does not")
        if entry.status == Status.ROLLED_BACK and blamed_feeds:
            entry.reason = reason


def _outcome(report: Report) -> tuple:
    """What a partial inlining must reproduce: as many regions and rotations fused, validated alike."""
    return report.fused, report.validated, sum(r.status == Status.FUSED for r in report.rotary)


def _fuse_loaded(
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
    banned: dict[int, dict[str, str]] = {}  # region → forms that did not validate there, and why
    search_once = partial(
        fuse_once,
        budgets=budgets,
        excluded=excluded,
        banned=banned,
        source=loaded.source,
        weights=weights,
        origins=origins,
    )
    prepared, chosen, fused_proto, report, opset_note = _searched(loaded, prepared, chosen, search_once)
    if validate and report.changed:
        t0 = time.perf_counter()
        fused_proto, report = _judged_rounds(original, prepared, chosen, fused_proto, report, search_once, feeds,
                                             weights, budgets, excluded, banned)  # fmt: skip
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
        failing = judge(original, fused_proto, report, feeds, weights, budgets.validation_bytes)
        if not failing:
            return fused_proto, report
        if round_ < VALIDATION_ROUNDS - 1:
            failing = upstream_only(failing, fused_proto, report)
        note = report.validation_note
        excluded.update(ban_forms(failing, report, banned))
        fused_proto, report = search_once(prepared, chosen)
        if not report.changed:
            report.validated, report.validation_note = None, note
            return fused_proto, report
    # Unproven after every round: change nothing.
    if judge(original, fused_proto, report, feeds, weights, budgets.validation_bytes):
        report.validated = None
        report.validation_note = f"nothing applied: validation still failed after {VALIDATION_ROUNDS} rounds"
        for entry in [*report.regions, *report.rotary, *report.layer_ops]:
            if entry.status == Status.FUSED:
                entry.status, entry.reason = Status.ROLLED_BACK, "validation did not settle"
        fused_proto = original
    return fused_proto, report
