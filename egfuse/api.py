"""``fuse()``: the one place that knows the order of the stages.

load → prepare (opset, shapes, facts) → rotations (RoPE, proven and written apart) → regions → lower → saturate
→ extract → raise → validate → report.
A region or rotation whose fused outputs disagree with the original on onnxruntime is rolled back (the
pipeline is re-run with it excluded; the ones nothing else that differs feeds go first) and the report says by
how much it was off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from egfuse import diagnose, functions, protos, validate
from egfuse.cost import CostModel, WithoutForms
from egfuse.dims import integer_text_dims
from egfuse.errors import EgfuseError
from egfuse.extract import extract
from egfuse.facts import SAME_SHAPE, GraphFacts
from egfuse.load import LoadedModel, ModelLike, default_opset, load
from egfuse.lower import Lowerer
from egfuse.raise_ import Emitter, replace_output
from egfuse.regions import find_regions
from egfuse.report import RegionReport, Report, RotaryReport
from egfuse.rotary import RotaryWriter, find_rotations
from egfuse.rules import ruleset_for
from egfuse.session import EClass, Session
from egfuse.shapes import class_shapes
from egfuse.targets import get_target
from egfuse.targets.spec import FUSED, STANDARD_ATTENTION_OPSET, TargetSpec


@dataclass
class Budgets:
    """Saturation limits: egglog's ``run`` has none of its own."""

    max_iterations: int = 24
    max_enodes_factor: float = 4.0  # of the e-graph's size after loading
    max_seconds: float = 60.0


@dataclass
class FuseResult:
    model: onnx.ModelProto
    report: Report
    _source_external: bool = field(default=False, repr=False)
    """The input kept its weights outside the .onnx file (the result keeps only this of the input: holding the
    input itself would keep a second copy of a large model's weights alive as long as the result)."""

    def save(self, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
        """Write atomically (a temp file renamed into place): never a half-written model at ``path``. Weights go
        to ``<name>.data`` beside it when the input kept them external (or when asked, or past protobuf's 2 GB)."""
        if external_data is None and self._source_external:
            external_data = True
        save_model(self.model, Path(path), external_data=external_data)

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
) -> FuseResult:
    """Fuse every attention block of ``model`` for ``target`` (``egfuse.targets()`` lists them), proven on
    onnxruntime. ``shapes`` binds symbolic dims (a symbol, or a word in it: ``{"seq": 512, "past": 1024}``) to
    the sizes the cost model should choose the fastest form for."""
    start = time.perf_counter()
    chosen = get_target(target)  # fail early on an unknown name
    if shapes is not None:
        chosen = chosen.for_shapes(shapes)
    loaded = load(model)
    budgets = budgets or Budgets()
    searched = loaded.proto
    if functions.calls_local_functions(loaded.proto):
        fused_proto, report, searched = _fuse_through_functions(loaded, chosen, validate, feeds, budgets)
    else:
        fused_proto, report = _fuse_loaded(loaded, chosen, validate, feeds, budgets)
    examined = {r.softmax for r in report.regions}  # If branches on known conditions were folded into the graph
    report.unexamined = [u for u in functions.softmaxes_in_subgraphs(searched) if u.split(": ")[-1] not in examined]
    report.stats["seconds_total"] = time.perf_counter() - start
    return FuseResult(fused_proto, report, loaded.external_data)


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
        report.notes.append(f"the model's local functions could not be inlined ({_short(err)}): not searched")
        return fused_proto, report, loaded.proto
    fused_proto, report = _fuse_loaded(
        replace(loaded, proto=full.proto), chosen, validate, feeds, budgets, full.origins
    )
    total = len(full.inlined)
    if not report.changed:
        report.functions = {"inlined": [], "kept": full.inlined}
        report.notes.append(
            f"the model's {total} local functions were inlined to look for attention; nothing fused, so the model "
            "is returned as it came, functions and all"
        )
        return loaded.proto, report, full.proto
    needed = {label for r in [*report.regions, *report.rotary] if r.status == "fused" for label in r.functions}
    partial = functions.inline(loaded.proto, only=needed)
    spared = set(partial.kept) - set(full.kept)  # called functions the partial inlining keeps
    why_all = "every function holds fused attention or calls one that does"
    if spared and default_opset(fused_proto) > default_opset(loaded.proto):
        why_all = "the opset was raised for the standard ops, and onnx's version converter drops functions"
    elif spared:
        proto2, report2 = _fuse_loaded(
            replace(loaded, proto=partial.proto), chosen, validate, feeds, budgets, partial.origins
        )
        if _outcome(report2) == _outcome(report):
            # Regions of the first search that stayed inside kept functions: the second never saw them.
            for r in report.regions:
                if r.status != "fused" and r.functions and set(r.functions) <= spared:
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


def _outcome(report: Report) -> tuple:
    """What a partial inlining must reproduce: as many regions and rotations fused, validated alike."""
    return report.fused, report.validated, sum(r.status == "fused" for r in report.rotary)


def _fuse_loaded(
    loaded: LoadedModel,
    chosen: TargetSpec,
    validate: bool,
    feeds: dict | None,
    budgets: Budgets,
    origins: dict[str, str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """One model through the stages; ``origins`` maps inlined node names to the functions they came from."""
    if not protos.is_large(loaded.proto):
        fused_proto, report = _fuse(loaded, chosen, validate, feeds, budgets, None, origins)
    else:  # every stage on the graph without its weights; the weights come back into the result alone
        with protos.DetachedWeights(loaded.proto) as weights:
            skeleton = replace(loaded, proto=weights.skeleton)
            fused_proto, report = _fuse(skeleton, chosen, validate, feeds, budgets, weights, origins)
            fused_proto = weights.restore(fused_proto) if report.changed else loaded.proto
        if weights.lifted and report.changed:
            report.notes.append(
                f"{weights.lifted} large Constant values are initializers in the result (the same values: only "
                "initializers can be stored outside a model past protobuf's 2 GB)"
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
    prepared, prepare_note = _prepare(loaded, chosen, validate)
    excluded: dict[RegionKey, tuple[str, float]] = {}
    banned: dict[int, dict[str, str]] = {}  # region → forms that did not validate there, and why
    fuse_once = partial(
        _fuse_once,
        budgets=budgets,
        excluded=excluded,
        banned=banned,
        source=loaded.source,
        weights=weights,
        origins=origins,
    )
    fused_proto, report = fuse_once(prepared, chosen)
    opset_note = None
    if _needs_standard_opset(prepared, fused_proto):
        converted, chosen, opset_note = _admit_standard_attention(loaded, prepared, chosen)
        if converted is not None and _same_nodes(converted, loaded.proto):
            # The conversion only renumbered the opset: what was fused stands, under the new number.
            prepared = _bump_opset(prepared, STANDARD_ATTENTION_OPSET)
            fused_proto.ir_version = prepared.ir_version = max(prepared.ir_version, converted.ir_version)
        else:
            prepared = infer_shapes(integer_text_dims(converted)) if converted is not None else prepared
            fused_proto, report = fuse_once(prepared, chosen)
    if validate and report.changed:
        t0 = time.perf_counter()
        for round_ in range(_VALIDATION_ROUNDS):
            failing = _validate(original, fused_proto, report, feeds, weights)
            if not failing:
                break
            if round_ < _VALIDATION_ROUNDS - 1:
                failing = _upstream_only(failing, fused_proto, report)
            note = report.validation_note
            excluded.update(_ban_forms(failing, report, banned))
            fused_proto, report = fuse_once(prepared, chosen)
            if not report.changed:
                report.validated, report.validation_note = None, note
                break
        else:
            if _validate(original, fused_proto, report, feeds, weights):  # unproven after every round: change nothing
                report.validated = None
                report.validation_note = f"nothing applied: validation still failed after {_VALIDATION_ROUNDS} rounds"
                for entry in [*report.regions, *report.rotary]:
                    if entry.status == "fused":
                        entry.status, entry.reason = "rolled back", "validation did not settle"
                fused_proto = original
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


# --- stages -------------------------------------------------------------------------------------------------


def _prepare(loaded: LoadedModel, target: TargetSpec, will_validate: bool) -> tuple[onnx.ModelProto, str | None]:
    """Raise the opset where the target needs it and infer shapes; returns the model and a note for the report."""
    proto, note = loaded.proto, None
    old = default_opset(proto)
    if target.requires_standard_opset and old < STANDARD_ATTENTION_OPSET:
        converted, reason = _to_standard_opset(proto)
        if converted is None and not will_validate:
            raise EgfuseError(
                f"cannot convert opset {old} to {STANDARD_ATTENTION_OPSET} for the standard Attention op "
                f"({reason}); enable validation to try a plain opset bump, or use --target ort",
                path=loaded.source,
            )
        if converted is None:
            converted = _bump_opset(proto, STANDARD_ATTENTION_OPSET)
            converted.ir_version = max(converted.ir_version, 10)
            note = (
                f"onnx's version converter could not convert opset {old} → {STANDARD_ATTENTION_OPSET} ({reason}); "
                "the opset import was raised as is and the result checked on onnxruntime"
            )
        proto = converted
    return infer_shapes(integer_text_dims(proto)), note


def _needs_standard_opset(prepared: onnx.ModelProto, fused: onnx.ModelProto) -> bool:
    """A target that may choose the standard ops (``ort``) chose one in a model below opset 23."""
    if default_opset(prepared) >= STANDARD_ATTENTION_OPSET:
        return False
    return any(n.op_type in _STANDARD_OPS and n.domain in ("", "ai.onnx") for n in fused.graph.node)


_STANDARD_OPS = frozenset({"Attention", "RotaryEmbedding"})
"""The default-domain ops egfuse writes that need opset 23."""


def _admit_standard_attention(
    loaded: LoadedModel, prepared: onnx.ModelProto, target: TargetSpec
) -> tuple[onnx.ModelProto | None, TargetSpec, str]:
    """The model converted to opset 23, for ``ort`` to use the standard op where it runs fastest — or, where
    onnx's converter cannot convert it, None and a target that does without the standard op (grouped K/V
    heads are then repeated for MultiHeadAttention). Unlike the ``onnx`` target, ``ort`` has that fallback,
    so no unconverted opset bump is ever tried here."""
    old = default_opset(prepared)
    converted, reason = _to_standard_opset(loaded.proto)
    if converted is None:
        note = (
            f"onnx's version converter could not convert opset {old} → {STANDARD_ATTENTION_OPSET} ({reason}), "
            "so the standard Attention and RotaryEmbedding ops were not used (grouped K/V heads are repeated for "
            "MultiHeadAttention, RoPE stays as it was)"
        )
        return None, target.below_opset(old), note
    note = (
        f"opset {old} → {STANDARD_ATTENTION_OPSET} (onnx's version converter) for the standard ops onnxruntime "
        "runs fastest: Attention on (B, N, S, H) inputs and grouped K/V heads, RotaryEmbedding"
    )
    return converted, target, note


def _to_standard_opset(proto: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    """onnx's version converter to opset 23 (IR version 10 at least), or None and why it refused."""
    try:
        converted = onnx.version_converter.convert_version(proto, STANDARD_ATTENTION_OPSET)
    except Exception as err:  # the converter raises bare RuntimeErrors with C++ text: its last line says why
        text = str(err).strip()
        return None, text.splitlines()[-1][-160:] if text else type(err).__name__
    converted.ir_version = max(converted.ir_version, 10)
    return converted, ""


def _same_nodes(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """The same computation node for node (the converter drops nodes' metadata, which is not computation)."""

    def key(n: onnx.NodeProto) -> tuple:
        attrs = tuple(x.SerializeToString(deterministic=True) for x in n.attribute)
        return n.op_type, n.domain, tuple(n.input), tuple(n.output), attrs

    return len(a.graph.node) == len(b.graph.node) and all(
        key(x) == key(y) for x, y in zip(a.graph.node, b.graph.node, strict=True)
    )


def _bump_opset(proto: onnx.ModelProto, version: int) -> onnx.ModelProto:
    bumped = onnx.ModelProto()
    bumped.CopyFrom(proto)
    for entry in bumped.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    return bumped


def infer_shapes(proto: onnx.ModelProto, rounds: int = 3) -> onnx.ModelProto:
    """ONNX shape inference, helped past ops it does not know (contrib norms, LayerNormalization below opset
    17): their output takes their input's shape, and inference runs again from there."""
    for _ in range(rounds):
        try:
            proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        except Exception:  # shapes are an aid: the rules still run on what is known
            return proto
        known = {v.name: v for v in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output]}
        known.update({t.name: None for t in proto.graph.initializer})
        added = False
        for node in proto.graph.node:
            if node.op_type not in SAME_SHAPE or not node.output or node.output[0] in known:
                continue
            source = known.get(node.input[0]) if node.input else None
            if source is not None and source.type.tensor_type.HasField("shape"):
                info = onnx.ValueInfoProto()
                info.CopyFrom(source)
                info.name = node.output[0]
                proto.graph.value_info.append(info)
                added = True
        if not added:
            break
    return proto


def _fuse_once(
    prepared: onnx.ModelProto,
    target: TargetSpec,
    *,
    budgets: Budgets,
    excluded: dict[RegionKey, tuple[str, float]],
    banned: dict[int, dict[str, str]],
    source: str,
    weights: protos.DetachedWeights | None,
    origins: dict[str, str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    target_name = target.name
    model = weights.to_ir(prepared) if weights is not None else ir.serde.deserialize_model(prepared)
    graph = model.graph
    report = Report(source=source, target=target_name, nodes_before=len(prepared.graph.node))

    if functions.concat_sequences(graph) and weights is None:
        model = ir.serde.deserialize_model(infer_shapes(ir.serde.serialize_model(model)))
        graph = model.graph
    facts = GraphFacts(graph)
    for _ in range(8):  # a folded branch may hold Ifs of its own (torchlib's squeeze and gather nest them)
        if not functions.fold_constant_ifs(graph, facts):
            break
        if weights is None:  # the branches' ops had no shapes (an If's output has none): infer them now
            model = ir.serde.deserialize_model(infer_shapes(ir.serde.serialize_model(model)))
            graph = model.graph
        facts = GraphFacts(graph)
    # Rotations first: their outputs become plain values to the attention regions found after them.
    rotated = _fuse_rotations(graph, facts, target, excluded, report, origins)
    regions = find_regions(graph, facts)
    session = Session()
    lowerer = Lowerer(facts, session.names, default_opset(prepared))
    for region in regions:
        lowerer.lower(region)
    session.add(lowerer.table.commands)
    t0 = time.perf_counter()
    start_size = session.size()
    stats = session.run(
        ruleset_for(target.rule_families),
        max_iterations=budgets.max_iterations,
        max_enodes=int(start_size * budgets.max_enodes_factor) + 1000,
        max_seconds=budgets.max_seconds,
    )
    report.stats.update(
        seconds_saturate=time.perf_counter() - t0,
        enodes_before=stats.enodes_before,
        enodes_after=stats.enodes_after,
        iterations=stats.iterations,
        stop_reason=stats.stop_reason,
    )
    classes, fact_tables = session.freeze()
    class_of: dict[ir.Value, EClass] = {}
    for cid, nodes in classes.items():
        for node in nodes:
            if node.op in ("ref", "value"):
                class_of[lowerer.table.values[node.args[0]]] = cid
    shapes = class_shapes(classes, lowerer.table, facts)
    cost_model = CostModel(target, shapes)
    choice = extract(classes, cost_model)
    runnable = {op.constructor for op in target.ops}

    any_fused = False
    opsets: set[tuple[str, int]] = set()
    notes: list[str] = []
    no_bias_classes = {cid for cid, nodes in classes.items() if any(n.op == "no_bias" for n in nodes)}
    for region in regions:
        entry = RegionReport(
            region.index,
            region.name,
            "not fused",
            output=region.main_output.name,
            variants=diagnose.variants(region, facts),
            functions=functions.origin([region.softmax, *region.nodes], origins),
        )
        report.regions.append(entry)
        main = class_of.get(region.main_output)
        fused_ops = _fused_ops(main, choice) if main is not None else []
        entry.candidates = diagnose.candidates(main, classes, choice, cost_model) if main is not None else []
        if not fused_ops:
            entry.reason = diagnose.cheaper_unfused(entry.candidates, target_name) or diagnose.why_not(
                region, class_of, classes, runnable, target_name
            )
            continue
        if region.index in excluded:
            reason, diff = excluded[region.index]
            entry.status, entry.reason, entry.max_abs_diff = "rolled back", reason, diff
            continue
        region_choice = choice
        if banned.get(region.index):  # forms that did not validate here: the next cheapest one instead
            region_choice = extract(classes, WithoutForms(cost_model, set(banned[region.index])))
            fused_ops = _fused_ops(main, region_choice)
            entry.notes.extend(f"{form} did not validate ({why})" for form, why in banned[region.index].items())
            if not fused_ops:
                entry.status, entry.reason = "rolled back", "no fused form validated"
                continue
        entry.form = fused_ops[0].op
        emitter = Emitter(
            graph,
            facts,
            lowerer.table,
            classes,
            fact_tables["rank_of"],
            region_choice,
            target,
            f"egfuse/r{region.index}",
            shapes,
            default_opset(prepared),
        )
        # Only outputs whose program goes through the fused op are rewritten; the rest (a mask shared with
        # the next layer, a projection used elsewhere) keep their original nodes.
        try:
            replacements = [
                (out, emitter.value(class_of[out]))
                for out in region.outputs
                if out in class_of and _fused_ops(class_of[out], region_choice)
            ] + emitter.also_replace
        except (ValueError, KeyError) as err:  # nothing was inserted yet: the region stays as it was
            entry.reason = f"the fused form could not be written as ONNX: {err}"
            continue
        anchor = region.nodes[-1]
        graph.insert_before(anchor, emitter.new_nodes)
        for old, new in replacements:
            replace_output(graph, old, new, fresh=new in emitter.created)
        entry.status = "fused"
        written = [target.op_for(op.op) for op in fused_ops]
        entry.fused_into = written[0].label
        opsets.update((op.domain, op.opset) for op in written)
        if emitter.cache_note is not None:
            entry.variants["kv cache"] = emitter.cache_note
        if written[0].mask_note and fused_ops[0].args[3] not in no_bias_classes and written[0].mask_note not in notes:
            notes.append(written[0].mask_note)
        any_fused = True

    report.notes.extend(notes)
    if rotated:
        opsets.add(("", STANDARD_ATTENTION_OPSET))
    if any_fused or rotated:
        for domain, version in opsets:
            if model.opset_imports.get(domain, 0) < version:
                model.opset_imports[domain] = version
        ir_passes.RemoveUnusedNodesPass()(model)
        # What each region wrote alike (a mask squeezed or made additive from the same input, constants) is
        # computed once for all layers.
        ir_passes.CommonSubexpressionEliminationPass()(model)
        ir_passes.TopologicalSortPass()(model)
    out = ir.serde.serialize_model(model)
    report.nodes_after = len(out.graph.node)
    return out, report


_VALIDATION_ROUNDS = 6
"""Rounds of validate → roll back → re-fuse; the last one rolls back everything that still differs."""

RegionKey = int | tuple[str, int]
"""What validation rolls back: an attention region's index, or ("rotary", index)."""


def _fuse_rotations(
    graph: ir.Graph,
    facts: GraphFacts,
    target: TargetSpec,
    excluded: dict[RegionKey, tuple[str, float]],
    report: Report,
    origins: dict[str, str] | None = None,
) -> bool:
    """Write each proven RoPE as one ``RotaryEmbedding``; the report says what became of each."""
    writer, unavailable, rotated = RotaryWriter(graph, facts), target.no_rotary, False
    for candidate in find_rotations(graph, facts):
        rotation = candidate.rotation
        entry = RotaryReport(candidate.index, candidate.output_name, "not fused", reason=candidate.reason)
        entry.functions = functions.origin([candidate.anchor], origins)
        report.rotary.append(entry)
        if rotation is None:
            continue
        entry.variant = rotation.variant
        if unavailable is not None:
            entry.reason = unavailable
        elif ("rotary", candidate.index) in excluded:
            entry.status = "rolled back"
            entry.reason, entry.max_abs_diff = excluded["rotary", candidate.index]
        else:
            writer.write(rotation, at=candidate.anchor)
            entry.status, entry.fused_into = "fused", "RotaryEmbedding"
            rotated = True
    return rotated


def _fused_ops(cid: EClass, choice: dict) -> list:
    """The fused e-nodes in the program extracted for ``cid`` (empty: the region stays as it was)."""
    found, seen, stack = [], set(), [cid]
    while stack:
        c = stack.pop()
        if c in seen or c not in choice:
            continue
        seen.add(c)
        node = choice[c].node
        if node.op in FUSED:
            found.append(node)
        stack.extend(node.children)
    return found


def _validate(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: Report,
    feeds: dict | None,
    weights: protos.DetachedWeights | None,
) -> dict[RegionKey, tuple[str, float]]:
    """Compare graph outputs and every fused region's and rotation's output; return what to roll back."""
    entries = _fused_entries(report)
    names = [r.output for r in entries.values() if r.output]
    try:
        data, expected = validate.original_outputs(original, feeds, names, weights=weights)
    except Exception as err:
        # Unproven is not proven: keep the original regions, and say how to give real inputs.
        report.validated = None
        report.validation_note = (
            f"nothing applied: the original model does not run on generated inputs ({_short(err)}); "
            "pass real inputs (feeds= / --feeds inputs.npz) or skip the check (validate=False / --no-validate)"
        )
        reason = "not validated (the original does not run on generated inputs)"
        return dict.fromkeys(entries, (reason, float("nan")))
    try:
        actual = validate.run(fused, data, names, weights=weights)
    except Exception as err:
        report.validated = False
        report.validation_note = f"the fused model does not run on onnxruntime: {_short(err)}"
        return dict.fromkeys(entries, (f"fused model failed to run: {_short(err)}", float("inf")))
    reference = validate.references(original, data, expected, names, weights=weights)
    failing: dict[RegionKey, tuple[str, float]] = {}
    for key, r in entries.items():
        name = r.output
        if name and name in expected and name in actual:
            cmp = validate.compare(name, expected[name], actual[name], reference.get(name))
            r.max_abs_diff = cmp.max_abs_diff
            if not cmp.ok:
                failing[key] = (f"outputs differ from the original by {cmp.max_abs_diff:.3g}", cmp.max_abs_diff)
    outputs = [o.name for o in original.graph.output]
    cmps = [validate.compare(n, expected[n], actual[n], reference.get(n)) for n in outputs if n in actual]
    report.max_abs_diff = max((c.max_abs_diff for c in cmps), default=0.0)
    report.validated = all(c.ok for c in cmps) and not failing
    if not report.validated and not failing:  # outputs off but nothing singled out: roll back all
        failing = dict.fromkeys(entries, (f"graph outputs differ by {report.max_abs_diff:.3g}", report.max_abs_diff))
    return failing


def _fused_entries(report: Report) -> dict[RegionKey, RegionReport | RotaryReport]:
    """What validation judges, by the key it rolls back by."""
    entries: dict[RegionKey, RegionReport | RotaryReport] = {r.index: r for r in report.regions if r.status == "fused"}
    entries.update({("rotary", r.index): r for r in report.rotary if r.status == "fused"})
    return entries


def _ban_forms(
    failing: dict[RegionKey, tuple[str, float]], report: Report, banned: dict[int, dict[str, str]]
) -> dict[RegionKey, tuple[str, float]]:
    """Of the failing regions, those to roll back: a region with another fused form the target can write gets
    that form instead (the failed one banned for it, with the reason), and is tried again."""
    rollback = {}
    for key, (reason, diff) in failing.items():
        entry = report.regions[key] if isinstance(key, int) and key < len(report.regions) else None
        if entry is None or entry.form is None:
            rollback[key] = (reason, diff)
            continue
        tried = banned.setdefault(key, {})
        tried[entry.form] = reason
        left = [c for c in entry.candidates if c.get("cost_us") is not None and c["form"] not in (*tried, "unfused")]
        if not left:
            rollback[key] = (reason, diff)
    return rollback


def _upstream_only(
    failing: dict[RegionKey, tuple[str, float]], fused: onnx.ModelProto, report: Report
) -> dict[RegionKey, tuple[str, float]]:
    """The failing regions and rotations that no other failing one feeds. A region downstream of one that
    differs (the next layer, the attention reading a rotation) differs too, whether or not it is right:
    rolling back the upstream ones first and judging again keeps the right ones fused."""
    outputs = {key: r.output for key, r in _fused_entries(report).items()}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in fused.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    downstream: set[str] = set()
    for key in failing:
        stack = [outputs[key]] if outputs.get(key) else []
        seen: set[str] = set()
        while stack:
            for node in readers.get(stack.pop(), []):
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        stack.append(out)
        downstream |= seen
    roots = {key: why for key, why in failing.items() if outputs.get(key) not in downstream}
    return roots or failing


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return text[:300]


def save_model(model: onnx.ModelProto, path: Path, *, external_data: bool | None = None) -> None:
    path = Path(path)
    if external_data is None:
        external_data = protos.is_large(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = workdir / path.name
        if external_data:  # streamed tensor by tensor: no second copy of the weights in memory
            protos.save_with_external_data(model, staged)
        else:
            onnx.save_model(model, staged)
        data = workdir / f"{path.name}.data"
        if data.exists():
            os.replace(data, path.parent / data.name)
        os.replace(staged, path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
