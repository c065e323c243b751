"""Models whose attention sits inside ``If`` branches: each such branch searched and proven as a model of its own,
then put back, and the whole model proven again on both sides of each condition.

optimum's merged decoders (``decoder_model_merged.onnx``, the format transformers.js and many Hub repositories
ship) are one ``If`` on a ``use_cache_branch`` input, each branch a whole decoder: with and without the KV cache.
The condition is a graph input, so no branch can be folded away, and every attention block lies in a subgraph no
region covers. A branch reads only what the graph around it holds (inputs, initializers, values computed before
the ``If``): as a model whose inputs are the graph inputs it reads and whose initializers are the ones it reads,
it is searched, fused and validated by the whole pipeline — its regions judged one by one on feeds made for its
own inputs — and the fused branch goes back into the ``If``. The model is then run whole, original and fused, on
feeds with each condition (:func:`_both_sides`); where they differ, or a branch reads a value computed before
the ``If`` (which no generated feed would stand for), the model is returned as it came, with the reason.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from egfuse.files import protos
from egfuse.files.load import LoadedModel, default_opset
from egfuse.files.well_formed import outer_reads
from egfuse.preparation.renumbering import only_renumbered
from egfuse.report import Report, Status
from egfuse.validation import validate as validate_
from egfuse.validation.judge import short

__all__ = ["attention_branches", "fuse_through_branches"]

_BRANCHES = ("then_branch", "else_branch")


def attention_branches(proto: onnx.ModelProto) -> list[tuple[int, str]]:
    """(node index, branch name) of each branch holding a ``Softmax`` of its own, of the top-level ``If`` nodes
    on a graph input — where the graph itself holds no ``Softmax`` (its own attention is the usual search's;
    an ``If`` on a constant or on shapes is folded there)."""
    if any(node.op_type == "Softmax" for node in proto.graph.node):
        return []
    inputs = {i.name for i in proto.graph.input} - {t.name for t in proto.graph.initializer}
    found = []
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or node.input[0] not in inputs:
            continue
        for attr in node.attribute:
            if attr.name in _BRANCHES and any(n.op_type == "Softmax" for n in attr.g.node):
                found.append((index, attr.name))
    return found


def fuse_through_branches(
    fuse_loaded, loaded: LoadedModel, chosen, validate: bool, feeds: dict | None, budgets
) -> tuple[onnx.ModelProto, Report]:
    """Fuse every attention branch as a model of its own (:func:`standalone`), put the fused branches back and
    prove the whole model on both sides of each condition; the report lists every branch's regions, each noting
    its branch. Where the branches cannot be searched apart or the whole model does not agree, ``loaded``'s
    model comes back unchanged, the report saying why."""
    proto = loaded.proto
    merged: onnx.ModelProto | None = None  # copied once a branch is rewritten: a model nothing changed in is not
    report = Report(source=loaded.source, target=chosen.name, nodes_before=_node_count(proto.graph))
    opsets: dict[str, int] = {}
    replaced: list[tuple[int, str]] = []
    for index, name in attention_branches(proto):
        where = f"If {proto.graph.node[index].name or proto.graph.node[index].output[0]!r} {name}"
        model, why = standalone(proto, index, name)
        if model is None:
            report.notes.append(f"{where}: not searched ({why})")
            continue
        fused, branch = fuse_loaded(replace(loaded, proto=model), chosen, validate, None, budgets)
        _adopt(report, branch, where)
        if not branch.changed:
            continue
        if merged is None:
            merged = onnx.ModelProto()
            merged.CopyFrom(proto)
        for entry in fused.opset_import:
            opsets[entry.domain] = max(opsets.get(entry.domain, 0), entry.version)
        merged.ir_version = max(merged.ir_version, fused.ir_version)
        _put_back(merged, index, name, fused, proto)
        replaced.append((index, name))
    if merged is None:
        return proto, report
    old, new = default_opset(proto), opsets.get("", 0)
    if new > old and not only_renumbered(_without(merged, replaced), old, new):
        why = f"the fused branches need opset {new}, and the rest of the model is not the same at it"
        return proto, _kept(report, why)
    for domain, version in opsets.items():
        _raise_import(merged, domain, version)
    report.nodes_after = _node_count(merged.graph)
    if validate:
        why = _both_sides(proto, merged, feeds)
        if why is not None:
            return proto, _kept(report, why)
    return merged, report


def _without(model: onnx.ModelProto, branches: list[tuple[int, str]]) -> onnx.ModelProto:
    """``model``'s nodes with the given branches emptied: what was not rewritten, for the opset check (the
    weights are not copied: the check reads op types only)."""
    rest = onnx.ModelProto()
    rest.graph.node.extend(model.graph.node)
    rest.functions.extend(model.functions)
    for index, name in branches:
        del next(a.g for a in rest.graph.node[index].attribute if a.name == name).node[:]
    return rest


def standalone(proto: onnx.ModelProto, index: int, name: str) -> tuple[onnx.ModelProto | None, str]:
    """The branch as a model: its nodes and initializers, the outer initializers it reads as initializers, the
    graph inputs it reads as inputs, its outputs as outputs. None (and why) where it reads a value computed
    before the ``If``: feeds generated for it would stand for nothing the model computes."""
    branch = next(a.g for a in proto.graph.node[index].attribute if a.name == name)
    read = outer_reads(branch)
    inputs = {i.name: i for i in proto.graph.input}
    initializers = {t.name: t for t in proto.graph.initializer}
    computed = sorted(read - inputs.keys() - initializers.keys())
    if computed:
        return None, f"it reads values computed before the If: {', '.join(computed[:3])}"
    model = onnx.ModelProto()
    model.ir_version, model.producer_name = proto.ir_version, proto.producer_name
    model.opset_import.extend(proto.opset_import)
    model.functions.extend(proto.functions)
    graph = model.graph
    graph.name = f"{proto.graph.name or 'graph'}_{name}"
    graph.node.extend(branch.node)
    graph.initializer.extend(initializers[n] for n in sorted(read & initializers.keys()))
    graph.initializer.extend(branch.initializer)
    graph.input.extend(inputs[i.name] for i in proto.graph.input if i.name in read)
    graph.output.extend(branch.output)
    graph.value_info.extend(branch.value_info)
    return model, ""


def _put_back(merged: onnx.ModelProto, index: int, name: str, fused: onnx.ModelProto, proto: onnx.ModelProto) -> None:
    """The fused model's graph as the branch: its nodes, and the initializers the graph around does not hold
    (the constants the fused ops read); it reads the outer ones, and the graph inputs, as a branch does."""
    outer = {t.name for t in proto.graph.initializer}
    branch = next(a.g for a in merged.graph.node[index].attribute if a.name == name)
    kept_name, outputs = branch.name, list(branch.output)
    branch.Clear()
    branch.name = kept_name
    branch.node.extend(fused.graph.node)
    branch.initializer.extend(t for t in fused.graph.initializer if t.name not in outer)
    branch.output.extend(outputs)
    branch.value_info.extend(v for v in fused.graph.value_info if v.name not in {o.name for o in outputs})


def _raise_import(model: onnx.ModelProto, domain: str, version: int) -> None:
    for entry in model.opset_import:
        if entry.domain == domain:
            entry.version = max(entry.version, version)
            return
    model.opset_import.add(domain=domain, version=version)


def _both_sides(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict | None) -> str | None:
    """The whole models, original and fused, on the user's feeds or generated ones with each boolean condition
    input both ways; None where every run the original makes agrees, else why not."""
    base = dict(feeds) if feeds is not None else validate_.make_feeds(original)
    conditions = [i.name for i in original.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL
                  and np.size(base.get(i.name, np.zeros(2))) == 1]  # fmt: skip
    sets = [base] if feeds is not None else [{**base, **{c: np.array(v).reshape(np.shape(base[c])) for c in conditions}}
                                            for v in (True, False)]  # fmt: skip
    ran = 0
    for data in sets:
        try:
            expected = validate_.run(original, data)
        except Exception:  # the original does not run on this side's feeds: they prove nothing
            continue
        ran += 1
        try:
            actual = validate_.run(fused, data)
        except Exception as err:
            return f"the model with its branches fused does not run: {short(err)}"
        for name, value in expected.items():
            cmp = validate_.compare(name, value, actual[name], where_defined=True)
            if not cmp.ok:
                return f"with its branches fused, output {name} differs from the original by {cmp.max_abs_diff:.3g}"
    return None if ran else "the whole model does not run on generated inputs with either condition"


def _adopt(report: Report, branch: Report, where: str) -> None:
    """A branch's entries, notes and stats into the model's report, each entry saying its branch."""
    for entries, theirs in ((report.regions, branch.regions), (report.layer_ops, branch.layer_ops),
                            (report.rotary, branch.rotary)):  # fmt: skip
        for entry in theirs:
            entry.index = len(entries)
            if hasattr(entry, "notes"):  # (a rotation's entry has none: the report's notes name the branches)
                entry.notes.insert(0, f"in {where}")
            entries.append(entry)
    for note in [*branch.notes, *([branch.validation_note] if branch.validation_note else [])]:
        said = next((i for i, n in enumerate(report.notes) if n.endswith(f": {note}")), None)
        if said is None:
            report.notes.append(f"{where}: {note}")
        else:  # the same note of another branch: one note naming both
            before = report.notes[said][: -len(note) - 2]
            report.notes[said] = f"{before} and {where.rsplit(' ', 1)[-1]}: {note}"
    if branch.changed:
        report.validated = branch.validated if report.validated is None else report.validated and branch.validated
    for key, value in branch.stats.items():
        if value is None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            report.stats[key] = (report.stats.get(key) or 0) + value
        elif key not in report.stats:  # a stop reason: the first branch's, and another's where it differs
            report.stats[key] = value
        elif value not in str(report.stats[key]).split("; "):
            report.stats[key] = f"{report.stats[key]}; {value}"
    for rule, count in branch.rules.items():
        report.rules[rule] = report.rules.get(rule, 0) + count


def _kept(report: Report, why: str) -> Report:
    """Every fused entry put back, the model unchanged, with ``why``."""
    for entry in report.entries():
        if entry.status == Status.FUSED:
            entry.status, entry.reason = Status.ROLLED_BACK, why
    report.validated, report.validation_note = None, f"nothing applied: {why}"
    return report


def _node_count(graph: onnx.GraphProto) -> int:
    """Nodes in ``graph`` and in the graphs inside them: a merged decoder's are all in its ``If``."""
    return sum(1 + sum(_node_count(sub) for sub in protos.subgraphs(node)) for node in graph.node)
