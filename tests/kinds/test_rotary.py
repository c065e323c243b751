"""RoPE becomes one ``RotaryEmbedding`` op only where the graph proves the op computes the same thing, never
blocks attention fusion, and is put back by validation if it ever differs."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.files.load import default_opset
from egfuse.lowering.lower_terms import TermWriter
from egfuse.preparation import prepare
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import assert_same_outputs, fast_on, one_target_fast

ROPE = Variant(k_layout="transpose_0132", rope=True, rope_tables="positions")


def _rotary_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "RotaryEmbedding"]


def test_rope_on_q_and_k_becomes_two_ops_beside_the_attention(target):
    model = attention_model(ROPE)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    ops = _rotary_ops(result.model)
    assert len(ops) == 2 and all(n.domain == "" for n in ops)
    # (1, S, R) tables from positions, x of batch B: expanded to B for the op; the halves sliced once for both
    assert sum(n.op_type == "Slice" and n.name.startswith("egfuse/rope") for n in result.model.graph.node) == 2
    assert all(r.variant == "rotate-half" for r in result.report.rotary)
    assert "rotary embeddings fused: 2/2" in str(result.report)
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=3, batch=3, seq=4))


@pytest.mark.parametrize("target", fast_on("ort"))
def test_partial_rope_keeps_the_unrotated_features(target):
    model = attention_model(ROPE.replaced(rope_partial=True, head_dim=16))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    ops = _rotary_ops(result.model)
    assert [a.i for n in ops for a in n.attribute if a.name == "rotary_embedding_dim"] == [8, 8]
    assert all("partial (8 of 16 features)" in r.variant for r in result.report.rotary)
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize(("target", "seq_first"), one_target_fast([(False,), (True,)], ["bnsh", "bsnh"]))
def test_interleaved_rope_like_gptj(seq_first, target):
    """GPT-J pairs features (2i, 2i+1) and repeat_interleaves its tables, on (B, S, N, H) before the head
    transpose: the op's ``interleaved`` form, 3D on the merged heads for (B, S, N, H). Its tables need no
    proof beyond the graph's own repeat_interleave, so tables fed as inputs fuse too."""
    variant = ROPE.replaced(rope_interleaved=True, rope_seq_first=seq_first, rope_partial=True, rope_tables="inputs")
    model = attention_model(variant.replaced(head_dim=16))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    ops = _rotary_ops(result.model)
    attrs = [{a.name: a.i for a in n.attribute} for n in ops]
    expected = {"interleaved": 1, "rotary_embedding_dim": 8} | ({"num_heads": 2} if seq_first else {})
    assert attrs == [expected, expected]
    assert all(r.variant == "interleaved, partial (8 of 16 features)" for r in result.report.rotary)
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=5, batch=3, seq=4))


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_tables_fed_as_inputs_are_not_assumed_to_repeat_their_halves(target):
    """cos/sin given as inputs could hold anything in their second half: the rotation stays as it was, the
    attention still fuses, and the report says why."""
    model = attention_model(ROPE.replaced(rope_tables="inputs"))
    result = egfuse.fuse(model, target=target, feeds=feeds_for(model))
    assert result.report.fused == 1 and not _rotary_ops(result.model)
    assert all("halves are not provably equal (an input of the graph)" in r.reason for r in result.report.rotary)


@pytest.mark.parametrize("target", fast_on("ort"))
def test_a_rotation_that_differs_is_rolled_back(monkeypatch, target):
    """Validation is the backstop: with the halves' fact forced on tables that do not repeat (every graph input
    stated ``halves_repeat``), the op computes something else; validation catches it, puts the rotations back
    and keeps the attention."""
    state = TermWriter._facts

    def forced(self, value, term, leaf):
        state(self, value, term, leaf)
        if leaf and value.producer() is None and self.facts.weight(value) is None:
            self.table.commands.append(f"({self.n['halves_repeat']} {term})")

    monkeypatch.setattr(TermWriter, "_facts", forced)
    model = attention_model(ROPE.replaced(rope_tables="inputs"))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.validated is True and result.report.fused == 1, str(result.report)
    assert [r.status for r in result.report.rotary] == ["rolled back", "rolled back"]
    assert all(r.max_abs_diff > 1e-3 for r in result.report.rotary)
    assert not _rotary_ops(result.model)
    assert_same_outputs(model, result.model, feeds)


def test_ort_without_opset_23_keeps_rope_and_still_fuses_attention(monkeypatch):
    def refuse(model, version):
        raise RuntimeError("No Adapter For Resize from opset 18 to 19")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    monkeypatch.setattr(prepare, "only_renumbered", lambda *_: False)  # a model the converter must adapt
    model = attention_model(ROPE.replaced(heads=4, kv_heads=2))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="ort", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert not _rotary_ops(result.model) and default_opset(result.model) < 23
    assert all("opset 23" in r.reason for r in result.report.rotary)
    assert_same_outputs(model, result.model, feeds)


def _onnxscript_rotary_models():
    """onnxscript's RoPE test models (a dev-extra dependency; the tests above need none of it)."""
    return pytest.importorskip("onnxscript.rewriter.models._rotary_embedding_models", reason="onnxscript: dev extra")


_ONNXSCRIPT_CASES = ["test_case_1", "test_case_2", "partial_rotary_test_case"]


@pytest.mark.parametrize(("target", "case"), one_target_fast([(c,) for c in _ONNXSCRIPT_CASES], _ONNXSCRIPT_CASES))
def test_onnxscripts_rotary_models_fuse(case, target):
    """onnxscript's own RoPE fusion tests (position ids as (B, S) and as (S,), partial rotation of 32 of 80)."""
    import onnx_ir as ir

    built = getattr(_onnxscript_rotary_models(), case)()
    model = ir.serde.serialize_model(built.get_onnx_model())
    feeds = built.get_ort_inputs()
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert [r.status for r in result.report.rotary] == ["fused"], str(result.report)
    assert result.report.validated is True and len(_rotary_ops(result.model)) == 1
    assert_same_outputs(model, result.model, feeds)


def test_mismatched_partial_slices_do_not_fuse():
    """onnxscript's negative case: the kept part starts at 33, not 32 — one feature is dropped."""
    import onnx_ir as ir

    models = _onnxscript_rotary_models()
    model = ir.serde.serialize_model(
        ir.serde.deserialize_model(
            models._make_partial_rotary_script(True).to_model_proto(
                input_types=(models.INT64["B", "S"], models.FLOAT["B", 32, "S", 80]),
                output_types=(models.FLOAT["B", 32, "S", 79],),
            )
        )
    )
    result = egfuse.fuse(
        model,
        target="onnx",
        feeds={
            "position_ids": np.arange(8, dtype=np.int64).reshape(1, 8),
            "query": np.random.default_rng(0).random((1, 32, 8, 80), np.float32),
        },
    )
    assert [r.status for r in result.report.rotary] == ["not fused"]
    assert "concatenated back with x[..., R:]" in result.report.rotary[0].reason
    assert not _rotary_ops(result.model)


def _interleaved_model(cos_after_repeat: bool) -> onnx.ModelProto:
    """GPT-J's rotation, x (1, 2, 4, 8); its tables ``repeat_interleave`` of an input θ, with cos/sin taken
    before the repeat (GPT-J) or after it and after the heads axis is added (the same tables)."""
    from onnx import TensorProto, helper

    def const(name, values):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64,
                                [len(values)], values))  # fmt: skip

    shapes = {"ax": [1, 4], "pairs": [1, 1, 4, 4, 2], "flat": [1, 1, 4, 8], "zero": [0], "one": [1], "end": [8],
              "last": [-1], "two": [2], "back": [1, 2, 4, 8]}  # fmt: skip
    nodes = [const(name, values) for name, values in shapes.items()]
    for f in ("Cos", "Sin"):
        source = "theta" if cos_after_repeat else f"{f}_t"
        if not cos_after_repeat:
            nodes.append(helper.make_node(f, ["theta"], [source]))
        nodes += [
            helper.make_node("Unsqueeze", [source, "ax"], [f"{f}_u"]),
            helper.make_node("Expand", [f"{f}_u", "pairs"], [f"{f}_e"]),
            helper.make_node("Reshape", [f"{f}_e", "flat"], [f"{f}_r" if cos_after_repeat else f"{f}4"]),
        ]
        if cos_after_repeat:
            nodes.append(helper.make_node(f, [f"{f}_r"], [f"{f}4"]))
    nodes += [
        helper.make_node("Slice", ["x", "zero", "end", "last", "two"], ["even"]),
        helper.make_node("Slice", ["x", "one", "end", "last", "two"], ["odd"]),
        helper.make_node("Neg", ["odd"], ["neg"]),
        helper.make_node("Unsqueeze", ["neg", "last"], ["neg_u"]),
        helper.make_node("Unsqueeze", ["even", "last"], ["even_u"]),
        helper.make_node("Concat", ["neg_u", "even_u"], ["stacked"], axis=-1),
        helper.make_node("Reshape", ["stacked", "back"], ["rotated"]),
        helper.make_node("Mul", ["x", "Cos4"], ["x_cos"]),
        helper.make_node("Mul", ["rotated", "Sin4"], ["rot_sin"]),
        helper.make_node("Add", ["x_cos", "rot_sin"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "gptj_rope",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 8]),
         helper.make_tensor_value_info("theta", TensorProto.FLOAT, [1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("cos_after_repeat", [False, True])
def test_interleaved_tables_with_cos_taken_before_or_after_the_repeat(cos_after_repeat, target):
    """The rules move cos and sin inside the repeat and past the new heads axis, so both spellings are one
    table; the structural check alone (the old matcher) saw only the first."""
    model = _interleaved_model(cos_after_repeat)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 2, 4, 8), np.float32), "theta": rng.standard_normal((1, 4, 4), np.float32)}
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert [r.status for r in result.report.rotary] == ["fused"], str(result.report)
    assert result.report.rotary[0].variant == "interleaved" and len(_rotary_ops(result.model)) == 1
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize(
    "export",
    [
        "2024-06/mistral_eager.dynamo",  # add(x, y, alpha=1): x + y · 1, a CastLike reading y's type
        "2023-12/llama_eager.torchscript",  # cos_cached[:seq_len][position_ids]: rows cut, then gathered
        "2024-06/qwen2_sdpa.dynamo",  # aten::index as Transpose, GatherND, Transpose (identity perms)
        "2023-12/phi_eager.dynamo",  # partial, its putback a ConcatFromSequence
        "2026-11/llama_past_sdpa.dynamo",  # a decode step's tables folded to (1, 1, 1, H) constants
    ],
)
def test_older_exporters_rotations_fuse(export):
    """Spellings the hand-written matcher refused, each a missing identity: ``y · 1 = y`` (the scale family),
    rows cut or gathered by GatherND keep a table's repeated halves, the identity transpose of a matrix
    vanishes, a stored 4D table with a unit heads axis is that axis added to the table without it."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "data" / "drift" / f"{export}.onnx"
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    model = onnx.load(path)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert [r.status for r in result.report.rotary] == ["fused"] * 4, str(result.report)
    assert result.report.fused == 2 and result.report.validated is True
    assert len(_rotary_ops(result.model)) == 4
    assert_same_outputs(model, result.model, feeds)


def test_a_rotation_the_rules_cannot_prove_is_explained_where_the_proof_stopped():
    """TorchScript's Llama of 2023-12 with a cache gathers its tables as rows of a table cut outside the region
    (``cos_cached[:seq_len]`` computed once for the model): the rules cannot carry "halves repeat" past that cut.
    The rotation stays as written and the report names the step: the table's halves, and what the table comes
    from (the explanation walks rows/gathers down to it, which once failed on ``rows``' argument names)."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "data" / "drift" / "2023-12" / "llama_past_eager.torchscript.onnx"
    result = egfuse.fuse(onnx.load(path), target="ort", validate=False)
    assert result.report.rotary and all(r.status == "not fused" for r in result.report.rotary)
    assert all("halves are not provably equal (it comes from Slice)" in r.reason for r in result.report.rotary)


@pytest.mark.parametrize("partial", [False, True])
def test_a_folded_interleaved_table_is_the_interleave_of_its_even_entries(partial):
    """A static-shape export cuts a stored (max_positions, R) buffer at a fixed length: the interleaved table
    (each entry twice in pairs, ``repeat_interleave(t, 2)``) is a constant, no computation left to prove its
    pairs from. Its values say it: ``t = interleave(t[..., 0::2], t[..., 0::2])`` (RoFormer and GPT-J exported
    with fixed shapes). Before, the rotations stayed: "the sin table is not repeat_interleave(t, 2)"."""
    # dataclasses.replace, not Variant.replaced: the sampler's repair draws fixed-length buffers as positions
    variant = dataclasses.replace(ROPE, rope_tables="buffer", rope_interleaved=True, symbolic=False,
                                  rope_partial=partial, head_dim=16 if partial else ROPE.head_dim)  # fmt: skip
    model = attention_model(variant)
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert [r.status.value for r in result.report.rotary] == ["fused", "fused"], str(result.report)
    assert all(r.variant.startswith("interleaved") for r in result.report.rotary)
    assert len(_rotary_ops(result.model)) == 2
    assert_same_outputs(model, result.model, feeds)


def test_a_constant_with_equal_pairs_everywhere_is_no_table():
    """Every element the same (a zero bias) repeats in pairs trivially: it is not stated as an interleave, which
    would only grow the e-graph."""
    from egfuse.analysis.weight_summary import summarize

    assert summarize(np.repeat(np.arange(6, dtype=np.float32).reshape(2, 3), 2, axis=-1)).pairs_repeat
    assert not summarize(np.zeros((4, 8), np.float32)).pairs_repeat
    assert not summarize(np.arange(8, dtype=np.float32).reshape(2, 4)).pairs_repeat
    assert not summarize(np.repeat(np.arange(3, dtype=np.int64), 2)[None]).pairs_repeat  # not a float table


def _sliced_whole_after_the_heads_axis(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each unsqueezed table read through ``t[:, :, 0:MAX, :]`` — the whole sequence axis, whose
    length is symbolic — as dynamo writes ``sinusoidal_pos[None, None, :, :]`` (RoFormer)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, make = out.graph, onnx.helper.make_node
    tables = [n.output[0] for n in graph.node if n.op_type == "Unsqueeze" and n.output[0] in
              {i for m in graph.node if m.op_type == "Mul" for i in m.input}]  # fmt: skip
    graph.initializer.extend([onnx.numpy_helper.from_array(np.array([v], np.int64), name)
                              for name, v in (("from0", 0), ("to_end", 2**63 - 1), ("axis2", 2))])  # fmt: skip
    for node in graph.node:
        node.input[:] = [f"{i}_whole" if i in tables and node.op_type == "Mul" else i for i in node.input]
    graph.node.extend(make("Slice", [t, "from0", "to_end", "axis2"], [f"{t}_whole"]) for t in tables)
    return out


@pytest.mark.parametrize("target", fast_on("onnx"))
def test_a_table_sliced_whole_along_a_symbolic_axis_is_the_table(target):
    """``x[:, :, 0:MAX]`` along an axis of unknown length is ``x``: once it was an opaque cut (``sliced``) taken after
    the heads axis was added, which no rule carries the new axis out of — RoFormer's rotations stayed ("the sin
    table is not unsqueezed at x's heads axis")."""
    model = _sliced_whole_after_the_heads_axis(attention_model(ROPE))
    feeds = feeds_for(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    assert [r.status.value for r in result.report.rotary] == ["fused", "fused"], str(result.report)
    assert len(_rotary_ops(result.model)) == 2
    assert_same_outputs(model, result.model, feeds)
    assert_same_outputs(model, result.model, feeds_for(model, seed=3, batch=3, seq=5))
