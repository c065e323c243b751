"""Targets as data: each lists the ops it writes, raising follows the spec, and the same model fused for two
targets (or two shape bindings) gives different, validated programs. The ``npu`` target writes single-head
attention (SHA) of plain rank-3 ops: every block splits into per-head Softmaxes, with no fused op, no rank-4
Transpose of its own, grouped K/V heads read without a repeat, and a KV cache read in the split-score form."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.commands import cli
from egfuse.targets import TARGETS, get_target
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import DATA, assert_same_outputs, op_counts

ROOT = Path(__file__).resolve().parents[2]


def test_every_target_is_listed_with_a_description(capsys):
    listed = egfuse.targets()
    assert set(listed) == {"ort", "onnx", "npu"} and all(listed.values())
    assert cli.main(["targets"]) == 0
    out = capsys.readouterr().out
    for name, description in listed.items():
        assert f"{name} " in out and description in out


def test_no_module_outside_a_target_asks_for_a_target_by_name():
    """Adding a target touches its module and the registry: nothing branches on ``target.name == …``, and no
    module of targets/ imports the emitter (raising reads the spec, not the other way round)."""
    for path in [*(ROOT / "egfuse").glob("*.py"), *(ROOT / "rules").glob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "name":
                names = [c.value for c in node.comparators if isinstance(c, ast.Constant)]
                assert not set(names) & set(TARGETS), f"{path.name}:{node.lineno} branches on a target's name"
    for path in (ROOT / "egfuse" / "targets").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                forbidden = ("egfuse.writing.raise_", "egfuse.writing.writers")
                assert node.module not in forbidden, f"{path.name} imports {node.module}"


def test_an_unknown_target_names_the_known_ones():
    with pytest.raises(ValueError, match="ort, onnx, npu"):
        get_target("tpu")


# --- npu: single-head attention ------------------------------------------------------------------------------


def _rank4_transposes_written(model: onnx.ModelProto) -> list[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
        if v.type.tensor_type.HasField("shape")
    }
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "Transpose" and n.name.startswith("egfuse/") and ranks.get(n.input[0]) == 4
    ]


NPU_CASES = {
    "encoder, padding": Variant(),
    "causal": Variant(causal="trilu", k_layout="transpose_0132"),
    "select mask, guard": Variant(mask="where_finfo", guard=True, k_layout="transpose_0132"),
    "gqa": Variant(heads=4, kv_heads=2, k_layout="transpose_0132", causal="range_greater"),
    "mqa": Variant(heads=4, kv_heads=1, k_layout="transpose_0132"),
    "cross": Variant(cross=True, k_layout="transpose_0132"),
    "cache": Variant(past=True, k_layout="transpose_0132", causal="trilu"),
    "gqa cache": Variant(past=True, heads=4, kv_heads=2, k_layout="transpose_0132"),
    "position bias": Variant(position_bias=True, k_layout="transpose_0132"),
    "softcap": Variant(softcap="div", k_layout="transpose_0132"),
}


@pytest.mark.parametrize("variant", list(NPU_CASES.values()), ids=list(NPU_CASES))
def test_npu_writes_single_head_attention(variant: Variant):
    model = attention_model(variant)
    feeds = feeds_for(model, left_padding=True)
    result = egfuse.fuse(model, target="npu", feeds=feeds)
    report = result.report
    assert report.fused == 1 and report.validated is True, str(report)
    assert report.regions[0].fused_into == "SingleHeadAttention"
    counts = op_counts(result.model)
    assert counts.get("Softmax") == variant.heads, counts  # one per head
    assert not [k for k in counts if "Attention" in k], counts
    assert not _rank4_transposes_written(result.model)
    assert "Expand" not in counts or counts["Expand"] == op_counts(model).get("Expand"), counts  # no repeat_kv
    if variant.past:
        assert "split-score" in report.regions[0].variants["kv cache"]
        concat_of_cache = [
            n for n in result.model.graph.node if n.op_type == "Concat" and n.output[0].startswith("present")
        ]
        assert concat_of_cache  # the Concat stays for the present outputs only
    assert_same_outputs(model, result.model, feeds)


@pytest.mark.parametrize("mask", ["where_finfo", "where_reversed"])
def test_npu_writes_a_select_mask_as_arithmetic_on_its_condition(mask: str):
    """NPUs run Equal → Cast → Mul where a Select is slow: a finite-fill select mask becomes ``(1 − m)·fill``
    (or ``m·fill``), no Where, the same numbers."""
    model = attention_model(Variant(heads=2, mask=mask, k_layout="transpose_0132"))
    feeds = feeds_for(model, left_padding=True)
    result = egfuse.fuse(model, target="npu", feeds=feeds)
    assert result.report.fused == 1 and result.report.validated is True, str(result.report)
    counts = op_counts(result.model)
    assert "Where" not in counts and counts.get("Cast") == 1, counts
    assert_same_outputs(model, result.model, feeds)


def test_npu_shares_the_mask_between_layers():
    """Two layers read one padding mask: it is squeezed to rank 3 once for both, not once a layer."""
    model = onnx.load(DATA / "bert_eager.torchscript.onnx")
    feeds = dict(np.load(DATA / "bert_eager.torchscript.feeds.npz"))
    result = egfuse.fuse(model, target="npu", feeds=feeds)
    assert result.report.fused == 2 and result.report.validated is True, str(result.report)
    assert op_counts(result.model).get("Squeeze") == 1, op_counts(result.model)
    assert_same_outputs(model, result.model, feeds)


def test_npu_decode_step_of_one_token_fuses():
    """T = 1 (decode) reads the cache by split scores as prefill does."""
    model = attention_model(Variant(past=True, heads=4, kv_heads=1, k_layout="transpose_0132"))
    for seq in (1, 6):
        feeds = feeds_for(model, seq=seq)
        result = egfuse.fuse(model, target="npu", feeds=feeds)
        assert result.report.fused == 1 and result.report.validated is True, str(result.report)
        assert_same_outputs(model, result.model, feeds)


def test_same_model_different_targets_give_different_validated_programs():
    """Every target, and ort priced for CUDA, writes its own program — but where two targets' fastest forms
    are the same op: ort on onnxruntime's CPU writes the standard op on MultiHeadAttention's layout, as the onnx
    target does (the contrib MultiHeadAttention is its CUDA provider's choice)."""
    from egfuse.validation.validate import Settings

    model = attention_model(Variant(heads=4, k_layout="transpose_0132"))
    feeds = feeds_for(model)
    cuda = Settings(providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    written = {}
    for name, target, validation in [*((t, t, None) for t in TARGETS), ("ort:cuda", "ort", cuda)]:
        result = egfuse.fuse(model, target=target, feeds=feeds, validation=validation)
        assert result.report.fused == 1 and result.report.validated is True, f"{name}\n{result.report}"
        assert_same_outputs(model, result.model, feeds)
        written[name] = result.report.regions[0].fused_into, tuple(sorted(op_counts(result.model).items()))
    assert written["ort"] == written["onnx"], written
    assert len({written[name] for name in ("onnx", "npu", "ort:cuda")}) == 3, written


def test_shape_binding_is_validated_by_the_cli(tmp_path, capsys):
    model = attention_model(Variant())
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(SystemExit):
        cli.main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "--shape", "seq=zero"])
    assert "NAME=SIZE" in capsys.readouterr().err
    assert cli.main(["optimize", str(path), "-o", str(tmp_path / "o.onnx"), "-q", "--shape", "seq=512,batch=4"]) == 0
    assert (tmp_path / "o.onnx").exists()


def test_the_cpu_priced_ort_target_offers_packed_attention_only_below_opset_23():
    """Packed-QKV Attention won single-block timings on onnxruntime's CPU and lost whole encoders to the standard
    op (targets/ort.CPU_WHOLE_MODEL_LOSERS): priced for the CPU it comes back only where the standard op cannot
    be written; priced for CUDA it is always there."""
    from egfuse.targets import for_provider

    ort = TARGETS["ort"]
    assert "packed_attention" not in {op.constructor for op in ort.ops}
    assert "packed_attention" in {op.constructor for op in ort.below_opset(18).ops}
    cuda = for_provider(ort, ("CUDAExecutionProvider",))
    assert "packed_attention" in {op.constructor for op in cuda.ops}
    model = attention_model(Variant(heads=2))
    for keep, expected in ((False, "Attention"), (True, "com.microsoft.Attention")):
        result = egfuse.fuse(model, target="ort", feeds=feeds_for(model), raise_opset=not keep)
        assert result.report.fused == 1 and result.report.validated is True, str(result.report)
        assert expected in op_counts(result.model), (keep, op_counts(result.model))
