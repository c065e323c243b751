"""Bad input gets one clear line: a model that is not a well-formed graph is refused before anything is fused,
naming the file, the node or value and what is wrong (API: an ``EgfuseError`` subclass; CLI: exit 1, nothing
written); a bug of ours is one line too (exit 3), with the traceback on ``--debug``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.commands import cli
from egfuse.errors import EgfuseError, FeedsError, InvalidModelError, UnknownTargetError
from egfuse.files import protos
from egfuse.testing import Variant, attention_model, feeds_for

MODEL = attention_model(Variant())
F = onnx.TensorProto.FLOAT


def tiny(nodes: list[onnx.NodeProto], *, inputs=("x",), outputs=("y",), inits=(), ir_version=None) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        nodes,
        "tiny",
        [onnx.helper.make_tensor_value_info(n, F, [2, 3]) for n in inputs],
        [onnx.helper.make_tensor_value_info(n, F, [2, 3]) for n in outputs],
        list(inits),
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def relu(name: str, src: str, dst: str) -> onnx.NodeProto:
    return onnx.helper.make_node("Relu", [src], [dst], name=name)


def wrong_raw_size() -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weight.raw_data = weight.raw_data[:-4]
    return tiny([onnx.helper.make_node("Add", ["x", "w"], ["y"], name="add")], inits=[weight])


def wrong_value_count() -> onnx.ModelProto:
    weight = onnx.TensorProto(name="w", data_type=F, dims=[2, 3], float_data=[1.0] * 5)
    return tiny([onnx.helper.make_node("Add", ["x", "w"], ["y"], name="add")], inits=[weight])


def wrong_attribute_type() -> onnx.ModelProto:
    node = onnx.helper.make_node("Transpose", ["x"], ["y"], name="t")
    node.attribute.append(onnx.helper.make_attribute("perm", 1))  # one int: no permutation
    return tiny([node])


def untyped_tensor() -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weight.data_type = onnx.TensorProto.UNDEFINED
    return tiny([onnx.helper.make_node("Add", ["x", "w"], ["y"], name="add")], inits=[weight])


BAD = {
    "an undefined input": (tiny([relu("r", "nowhere", "y")]), ["'r'", "'nowhere'", "defines"]),
    "a cycle": (
        tiny([relu("a", "b_out", "a_out"), relu("b", "a_out", "b_out"), relu("c", "x", "y")]),
        ["cycle", "'a'", "'b'"],
    ),
    "a node reading its own output": (tiny([relu("self", "y", "y")]), ["'self'", "own output"]),
    "a missing output": (tiny([relu("r", "x", "z")]), ["graph output 'y'", "produced by no"]),
    "IR version 0": (tiny([relu("r", "x", "y")], ir_version=0), ["IR version 0", "unset"]),
    "a name defined twice": (
        tiny([relu("a", "x", "t"), relu("b", "x", "t"), relu("c", "t", "y")]),
        ["'t'", "defined twice", "'a'", "'b'"],
    ),
    "a node output named like an input": (tiny([relu("a", "x", "x"), relu("b", "x", "y")]), ["'x'", "twice"]),
    "a raw_data size off its shape": (wrong_raw_size(), ["initializer 'w'", "20 bytes", "needs 24"]),
    "a value count off its shape": (wrong_value_count(), ["initializer 'w'", "5 values", "needs 6"]),
    "an attribute of the wrong type": (wrong_attribute_type(), ["'perm'", "'t' (Transpose)", "INT, expected INTS"]),
    "a tensor without an element type": (untyped_tensor(), ["initializer 'w'", "no element type"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_model_is_refused_by_name(case: str):
    model, words = BAD[case]
    with pytest.raises(InvalidModelError) as raised:
        egfuse.fuse(model)
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_name_that_is_not_utf8_is_refused(tmp_path: Path, capsys):
    """Protobuf hands such a name over as bytes: nothing could write it back (onnx_ir's serializer failed)."""
    data = tiny([relu("NAME", "x", "y")]).SerializeToString().replace(b"NAME", b"\xeeAME")
    source = tmp_path / "m.onnx"
    source.write_bytes(data)
    assert cli.main(["optimize", str(source), "-o", str(tmp_path / "o.onnx")]) == 1
    err = capsys.readouterr().err
    assert "node #0 has a name that is not UTF-8 text: b'\\xeeAME'" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["a cycle", "IR version 0", "a raw_data size off its shape"])
def test_the_cli_says_one_line_and_writes_nothing(case: str, tmp_path: Path, capsys):
    source, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(BAD[case][0], source)
    code = cli.main(["optimize", str(source), "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"egfuse: error: file {source}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_debug_shows_the_traceback(tmp_path: Path, capsys):
    source = tmp_path / "bad.onnx"
    onnx.save(BAD["a cycle"][0], source)
    assert cli.main(["optimize", str(source), "-o", str(tmp_path / "o.onnx"), "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "InvalidModelError" in err
    assert err.strip().splitlines()[-1].startswith("egfuse: error: ") and "cycle" in err.strip().splitlines()[-1]
    assert cli.main(["--debug", "optimize", str(source), "-o", str(tmp_path / "o.onnx")]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_well_formed_models_are_not_refused():
    """What the structural check must accept: nodes out of order (onnxruntime sorts them), initializers
    listed as inputs too (IR < 4), and a subgraph reading a value of the graph around it."""
    unsorted = tiny([relu("b", "t", "y"), relu("a", "x", "t")])
    weight = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    listed = tiny([onnx.helper.make_node("Add", ["x", "w"], ["y"])], inputs=("x", "w"), inits=[weight])
    branch = onnx.helper.make_graph(
        [relu("inner", "t", "u")], "branch", [], [onnx.helper.make_tensor_value_info("u", F, [2, 3])]
    )
    cond = onnx.numpy_helper.from_array(np.array(True), "cond")
    nested = tiny(
        [relu("a", "x", "t"), onnx.helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)],
        inits=[cond],
    )
    for model in (unsorted, listed, nested):
        report = egfuse.fuse(model).report
        assert report.fused == 0 and report.validated is None


def test_a_subgraph_reading_an_undefined_value_is_refused():
    branch = onnx.helper.make_graph(
        [relu("inner", "ghost", "u")], "branch", [], [onnx.helper.make_tensor_value_info("u", F, [2, 3])]
    )
    cond = onnx.numpy_helper.from_array(np.array(True), "cond")
    model = tiny(
        [onnx.helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=branch)],
        inits=[cond],
    )
    with pytest.raises(InvalidModelError, match="'ghost'"):
        egfuse.fuse(model)


def test_what_onnx_checker_rejects_but_onnxruntime_runs_is_a_note():
    """A graph output without a shape: onnx's checker wants one, onnxruntime does not."""
    report = egfuse.fuse(MODEL).report
    assert report.fused == 1 and report.validated is True, str(report)
    assert any("onnx's checker rejects" in note and "'shape'" in note for note in report.notes), report.notes
    assert "onnx's checker rejects" in str(report)
    shaped = onnx.ModelProto()
    shaped.CopyFrom(MODEL)
    x, y = shaped.graph.input[0].type.tensor_type, shaped.graph.output[0].type.tensor_type
    y.shape.CopyFrom(x.shape)  # the block maps hidden states to hidden states
    onnx.checker.check_model(shaped)
    assert not [note for note in egfuse.fuse(shaped).report.notes if "checker" in note]


def test_onnx_checker_reads_no_weights_of_constant_nodes():
    """onnxscript's models ship their weights as ``Constant`` nodes; the checker's copy must stand in for them
    as it does for initializers (a 6.8 GB phi4 could not be serialized for the checker: protobuf's 2 GB limit)."""
    weights = onnx.ModelProto()
    weights.CopyFrom(MODEL)
    graph = weights.graph
    constants = [
        onnx.helper.make_node("Constant", [], [init.name], value=init)
        for init in graph.initializer
        if protos.tensor_bytes(init) >= 512
    ]
    assert constants, "the block has projection weights"
    names = {c.output[0] for c in constants}
    kept = [init for init in graph.initializer if init.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(constants + nodes)
    probe = protos.inference_probe(weights, None, inline_bytes=512)
    assert not any(n.op_type == "Constant" and n.output[0] in names for n in probe.graph.node)
    assert names <= {i.name for i in probe.graph.input}
    assert weights.ByteSize() - probe.ByteSize() >= sum(protos.tensor_bytes(c.attribute[0].t) for c in constants)
    report = egfuse.fuse(weights).report
    assert report.fused == 1 and report.validated is True, str(report)


def test_nodes_out_of_order_are_sorted_not_refused():
    """onnx requires nodes in the order they run; onnxruntime sorts them, and so does egfuse (in a copy)."""
    unsorted = onnx.ModelProto()
    unsorted.CopyFrom(MODEL)
    nodes = list(unsorted.graph.node)
    del unsorted.graph.node[:]
    unsorted.graph.node.extend(reversed(nodes))
    before = unsorted.SerializeToString()
    report = egfuse.fuse(unsorted).report
    assert report.fused == 1 and report.validated is True, str(report)
    assert unsorted.SerializeToString() == before


def test_an_unknown_target_is_an_egfuse_error():
    with pytest.raises(UnknownTargetError, match="unknown target 'gpu'; choose one of: ort") as raised:
        egfuse.fuse(MODEL, target="gpu")
    assert isinstance(raised.value, EgfuseError) and isinstance(raised.value, ValueError)


def test_an_internal_error_is_one_line_and_writes_nothing(tmp_path: Path, capsys, monkeypatch):
    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(MODEL, source)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug deep inside")

    monkeypatch.setattr(cli, "fuse", broken)
    assert cli.main(["optimize", str(source), "-o", str(out)]) == 3
    err = capsys.readouterr().err
    assert err.strip() == (
        "egfuse: internal error: RuntimeError: a bug deep inside — nothing was written; please report it with the "
        "traceback that --debug prints"
    )
    assert not out.exists()
    assert cli.main(["optimize", str(source), "-o", str(out), "--debug"]) == 3
    assert 'raise RuntimeError("a bug deep inside")' in capsys.readouterr().err


def test_a_closed_pipe_is_not_a_traceback():
    """``egfuse targets | head -0``: the reader is gone before egfuse writes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "egfuse", "targets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) in (0, 141)
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_feeds_with_wrong_names_exit_2_naming_the_inputs(tmp_path: Path, capsys):
    source, out, npz = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "feeds.npz"
    onnx.save(MODEL, source)
    feeds = feeds_for(MODEL)
    renamed = {("input_ids" if name == "x" else name): value for name, value in feeds.items()}
    np.savez(npz, **renamed)
    assert cli.main(["optimize", str(source), "-o", str(out), "--feeds", str(npz)]) == 2
    err = capsys.readouterr().err.strip()
    expected = ", ".join(i.name for i in MODEL.graph.input)
    assert err.startswith("egfuse: error: file ") and "\n" not in err
    assert "not inputs of the model: input_ids" in err and "missing: x" in err and f"it takes: {expected}" in err
    assert not out.exists()
    with pytest.raises(FeedsError):
        egfuse.fuse(MODEL, feeds=renamed)


def test_feeds_without_validation_warn(tmp_path: Path, capsys):
    source, out, npz = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "feeds.npz"
    onnx.save(MODEL, source)
    np.savez(npz, **feeds_for(MODEL))
    assert cli.main(["optimize", str(source), "-o", str(out), "--feeds", str(npz), "--no-validate", "-q"]) == 0
    err = capsys.readouterr().err
    assert f"egfuse: warning: --feeds {npz} is not used: --no-validate skips validation" in err
