"""``fuse()``: the pipeline from a user's model to a proven fused one, each stage a module of its own.

load (:mod:`~egfuse.files.load`) → the target for this run (:mod:`~egfuse.target_choice`) → prepare, search and judge
to a fixpoint (:mod:`~egfuse.fixpoint`: :mod:`~egfuse.preparation.prepare`, :mod:`~egfuse.search`,
:mod:`~egfuse.validation.judge`; through :mod:`~egfuse.inlined_search` where the model calls local functions) → report,
and a :class:`~egfuse.result.FuseResult` whose save (:mod:`~egfuse.files.save`) never writes over the input. A region
whose fused outputs disagree with the original on onnxruntime is rolled back and the report says by how much it was off.
"""

from __future__ import annotations

import time
from dataclasses import replace

from egfuse import progress
from egfuse.branch_search import attention_branches, fuse_through_branches
from egfuse.collector import paced_for_fusion
from egfuse.errors import FeedsError
from egfuse.files import node_metadata, well_formed
from egfuse.files.load import LoadedModel, ModelLike, load
from egfuse.fixpoint import fuse_loaded
from egfuse.inlined_search import fuse_through_functions, unloadable_note
from egfuse.preparation import functions
from egfuse.result import FuseResult, sign
from egfuse.search import Budgets
from egfuse.target_choice import for_run, get_target
from egfuse.targets.spec import TargetSpec
from egfuse.validation import validate as validate_

__all__ = ["Budgets", "FuseResult", "fuse"]


@paced_for_fusion()
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
    progress.stage("loading the model")
    loaded = load(model)
    chosen, priced = for_run(named, providers, shapes=shapes, rotary=rotary, raise_opset=raise_opset,
                             opset=loaded.opset, source=loaded.source)  # fmt: skip
    if feeds is not None and validate:
        _check_feed_names(feeds, loaded)
    given = loaded.proto  # handed back as it is where nothing changes
    lean, metadata = node_metadata.set_aside(given, in_place=loaded.owned)
    loaded = replace(loaded, proto=lean)
    checker_note = well_formed.checker_note(loaded.proto)
    budgets = budgets or Budgets()
    searched = loaded.proto
    with validate_.using(validation):
        if functions.calls_local_functions(loaded.proto):
            run = (loaded, chosen, validate, feeds, budgets)
            fused_proto, report, searched = fuse_through_functions(fuse_loaded, *run)
        elif attention_branches(loaded.proto):
            fused_proto, report = fuse_through_branches(fuse_loaded, loaded, chosen, validate, feeds, budgets)
        else:
            fused_proto, report = fuse_loaded(loaded, chosen, validate, feeds, budgets)
    examined = {r.softmax for r in report.regions}  # If branches on known conditions were folded into the graph
    report.unexamined = [u for u in functions.softmaxes_in_subgraphs(searched) if u.split(": ")[-1] not in examined]
    if checker_note:
        report.notes.append(unloadable_note(loaded, report, searched) or checker_note)
    report.notes.extend(_provider_notes(priced, providers))
    if not report.changed:
        fused_proto = given
    if metadata is not None and (report.changed or lean is given):  # taken off the given model itself: put back
        metadata.put_back(fused_proto)
    report.stats["seconds_total"] = time.perf_counter() - start
    if report.changed:
        sign(fused_proto)
    return FuseResult(fused_proto, report, loaded.external_data, loaded.files, loaded.weights_folder)


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
