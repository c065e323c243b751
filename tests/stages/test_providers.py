"""Forms chosen per execution provider: ``--provider CUDAExecutionProvider`` prices the ``ort`` target with the
costs measured on a GPU (experiments/bench_gpu.py), where the contrib ops beat the standard ``Attention`` and a
primitive node costs a kernel launch; validation runs on that provider when onnxruntime has it and on the CPU
otherwise, and says so. The calibration fit separates a node's launch cost from the throughput."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import egfuse
from egfuse.commands import calibrate
from egfuse.targets import for_provider, get_target, ort
from egfuse.testing import Variant, attention_model, disagreements, feeds_for
from egfuse.validation.validate import Settings

from ..conftest import DATA

CUDA = Settings(providers=("CUDAExecutionProvider",))


def test_the_ort_target_has_a_cuda_variant_and_the_others_keep_theirs():
    assert for_provider(get_target("ort"), ("CUDAExecutionProvider",)) is ort.CUDA_SPEC
    assert for_provider(get_target("ort"), ("CPUExecutionProvider",)) is get_target("ort")
    assert for_provider(get_target("onnx"), ("CUDAExecutionProvider",)) is get_target("onnx")
    profiled = dataclasses.replace(get_target("ort"), description="a profile the user gave")
    assert for_provider(profiled, ("CUDAExecutionProvider",)) is profiled  # the user's costs win


def test_the_cuda_profile_is_a_measurement_of_the_contrib_ops_being_faster():
    cpu, cuda = ({op.constructor: op for op in spec.ops} for spec in (ort.SPEC, ort.CUDA_SPEC))
    assert cuda["mha_kv4"].efficiency > 2 * cuda["attend"].efficiency
    assert cuda["mha_kv4"].absorbs_cache is False and cpu["mha_kv4"].absorbs_cache is True
    assert ort.CUDA_SPEC.costs.op_overhead_us > ort.SPEC.costs.op_overhead_us  # a kernel launch


def test_grouped_heads_for_cuda_become_multi_head_attention_validated_on_the_cpu():
    """At a long prefill (measured on an H100: MultiHeadAttention on repeated K/V 0.54 ms, the standard op 1.15)."""
    variant = Variant(kv_heads=4, heads=16, head_dim=64, causal="trilu", k_layout="transpose_0132", seed=3)
    model = attention_model(variant)
    long = {"batch": 1, "seq": 4096}
    default = egfuse.fuse(model, target="ort", shapes=long)
    cuda = egfuse.fuse(model, target="ort", validation=CUDA, shapes=long)
    assert {n.op_type for n in default.model.graph.node if "Attention" in n.op_type} == {"Attention"}
    ops = {(n.domain, n.op_type) for n in cuda.model.graph.node if "Attention" in n.op_type}
    assert ops == {("com.microsoft", "MultiHeadAttention")}, str(cuda.report)
    assert cuda.report.validated is True
    notes = " ".join(cuda.report.notes)
    assert "CUDAExecutionProvider's measured costs" in notes
    assert "validated on CPUExecutionProvider: CUDAExecutionProvider is not in this onnxruntime" in notes
    assert disagreements(model, cuda.model, feeds_for(model, seed=1, batch=3, seq=6, left_padding=True)) == []


def test_multi_head_attentions_layout_is_the_standard_op_on_the_cpu_and_the_contrib_op_on_cuda():
    """``mha`` (Q, K, V as (B, S, N·H) projections) is two ops for the ort target: the standard ``Attention`` with
    ``q_num_heads`` (``mha_standard``, what the onnx target writes) and ``com.microsoft.MultiHeadAttention``. On
    onnxruntime's CPU the standard op wins, and on its (B, S, N·H) inputs no head transposes are left around it
    (written on (B, N, S, H), BERT S=128 ran 2% behind the onnx target's identical op); CUDA's costs keep the
    contrib op, which ran 1.6x faster there (BERT S=2048, an H200)."""
    model = attention_model(Variant(heads=4, head_dim=16, k_layout="transpose_0132", seed=5))
    feeds = feeds_for(model, seed=2, batch=2, seq=5, left_padding=True)
    cpu = egfuse.fuse(model, target="ort", feeds=feeds)
    assert [r.form for r in cpu.report.regions] == ["mha_standard"] and cpu.report.validated, str(cpu.report)
    (op,) = [n for n in cpu.model.graph.node if "Attention" in n.op_type]
    assert (op.domain, op.op_type) == ("", "Attention")
    assert {a.name: a.i for a in op.attribute if a.name.endswith("num_heads")} == {"q_num_heads": 4, "kv_num_heads": 4}
    assert not any(n.op_type == "Transpose" for n in cpu.model.graph.node)
    standard = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert sorted(n.op_type for n in cpu.model.graph.node) == sorted(n.op_type for n in standard.model.graph.node)
    assert disagreements(model, cpu.model, feeds) == []
    cuda = egfuse.fuse(model, target="ort", feeds=feeds, validation=CUDA)
    assert [r.form for r in cuda.report.regions] != ["mha_standard"], str(cuda.report)
    assert {n.domain for n in cuda.model.graph.node if "Attention" in n.op_type} == {"com.microsoft"}
    below = egfuse.fuse(model, target="ort", feeds=feeds, raise_opset=False)  # no opset 23: the contrib op only
    assert [r.form for r in below.report.regions] != ["mha_standard"], str(below.report)


def test_a_cache_stays_outside_multi_head_attention_for_cuda():
    """onnxruntime's CUDA MultiHeadAttention refuses past_key beside (B, N, T, H) keys: the Concat is kept."""
    variant = Variant(past=True, heads=4, head_dim=16, k_layout="transpose_0132", seed=2)
    model = attention_model(variant)
    spec = dataclasses.replace(
        ort.CUDA_SPEC,
        ops=tuple(dataclasses.replace(op, efficiency=1e6) for op in ort.CUDA_SPEC.ops if op.constructor == "mha_kv4"),
        keep_unfused=False,
    )
    result = egfuse.fuse(model, target=spec)
    assert result.report.fused == 1, str(result.report)
    (mha,) = [n for n in result.model.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(mha.input) <= 6 or not any(mha.input[6:]), list(mha.input)  # no past_key / past_value
    assert any(n.op_type == "Concat" for n in result.model.graph.node)
    assert disagreements(model, result.model, feeds_for(model, seed=4, batch=2, seq=3)) == []


def test_a_decode_steps_cached_keys_read_through_a_folded_batch_become_multi_head_attention_for_cuda():
    """torch's decomposition of SDPA writes Kᵀ of the cached, repeated keys as (B·N, T, H) → Transpose → (B, N, H,
    T): K itself is no graph value, so its heads were unknown and MultiHeadAttention (which needs them equal to
    the query's) was never offered; the CUDA costs kept the step as written. Measured on an H100 (a grouped decode
    block, B=8, past 1023): MultiHeadAttention 182 µs, the step's own ops 214, the standard op 270; the 4-layer
    Llama decode step at 0.49 of the export, against 0.56 with its attention kept as written."""
    model = DATA / "drift" / "2026-04" / "llama_past_sdpa.dynamo.onnx"
    result = egfuse.fuse(model, target="ort", validation=CUDA)
    report = result.report
    assert report.fused == len(report.regions) == 2 and report.validated is True, str(report)
    assert {r.form for r in report.regions} == {"mha_kv4"}, str(report)
    assert sum(n.op_type == "MultiHeadAttention" for n in result.model.graph.node) == 2
    cpu = egfuse.fuse(model, target="ort").report  # the CPU's costs still choose the standard op
    assert {r.fused_into for r in cpu.regions} == {"Attention"}, str(cpu)


def _rows(alpha: float, per_node: float, efficiency: float, overhead: float) -> calibrate.Calibration:
    """Synthetic measurements of an unfused block and one fused op over a spread of sizes."""
    calibration = calibrate.Calibration("ort")
    o0 = get_target("ort").costs.op_overhead_us
    for i, (work, nodes, roof) in enumerate([(100.0, 20, 40.0), (900.0, 20, 400.0), (50.0, 30, 10.0), (3e3, 25, 2e3)]):
        unfused = alpha * work + per_node * nodes
        calibration.rows.append(calibrate.Measured(f"c{i}", "unfused", "ops", work + o0 * nodes, unfused, nodes=nodes))
        measured = alpha * roof / efficiency + overhead + per_node * 3 + alpha * 5.0
        own = roof / efficiency + overhead
        calibration.rows.append(
            calibrate.Measured(f"c{i}", "mha", "MultiHeadAttention", own + 5.0 + o0 * 3, measured, own, roof, nodes=3)
        )
    return calibration


def test_the_fit_separates_a_nodes_launch_from_the_throughput():
    profile = calibrate.fit(get_target("ort"), _rows(alpha=0.01, per_node=5.0, efficiency=2.0, overhead=7.0))
    assert profile["costs"]["op_overhead_us"] == pytest.approx(5.0, rel=1e-3)
    assert profile["costs"]["gflops"] == pytest.approx(get_target("ort").costs.gflops / 0.01, rel=1e-3)
    assert profile["ops"]["mha"]["efficiency"] == pytest.approx(2.0, rel=1e-3)


def test_node_counts_are_those_of_the_form_as_written():
    model = attention_model(Variant(heads=2, head_dim=8))
    fused = egfuse.fuse(model, target="ort").model
    label = next(f"{n.domain}.{n.op_type}" for n in fused.graph.node if "Attention" in n.op_type)
    assert calibrate.primitive_nodes(fused, label) == len(fused.graph.node) - 1
    assert calibrate.primitive_nodes(model, label) == len(model.graph.node)


def test_calibrating_on_a_provider_onnxruntime_lacks_is_a_usage_error(tmp_path, capsys):
    from egfuse.commands.cli import main

    out = tmp_path / "cuda.json"
    assert main(["calibrate", "--target", "ort", "-o", str(out), "--provider", "NoSuchExecutionProvider"]) == 2
    assert "NoSuchExecutionProvider is not in this onnxruntime" in capsys.readouterr().err
    assert not out.exists()


def _profile(tmp_path: Path, **entries) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": calibrate.PROFILE_VERSION, "target": "ort", **entries}))
    return path


SLOW = {"efficiency": 0.01, "overhead_us": 1000.0}


def test_a_profile_prices_an_op_per_element_type_and_says_it_ran_in_it():
    """``"form@dtype"`` entries: CUDA's kernels are not equally fast in float16 and bfloat16 (a measured entry is
    also the proof that the op loaded in that type)."""
    profile = {"version": 1, "target": "ort", "ops": {"mha@bfloat16": SLOW, "packed_attention@bfloat16": SLOW}}
    spec = ort.UNCALIBRATED.with_profile(profile)
    ops = {op.constructor: op for op in spec.ops}
    base = {op.constructor: op for op in ort.UNCALIBRATED.ops}
    assert ops["mha"].speed({"bfloat16"}) == (0.01, 1000.0)
    assert ops["mha"].speed({"float16"}) == (base["mha"].efficiency, base["mha"].overhead_us)
    assert ops["mha"].speed({"float16", "bfloat16"}) == (base["mha"].efficiency, base["mha"].overhead_us)
    assert "bfloat16" in ops["packed_attention"].dtypes and "bfloat16" not in base["packed_attention"].dtypes
    assert ops["mha_kv4"].per_dtype == ops["mha"].per_dtype  # the same kernel, unless measured apart
    assert ops["attend"].per_dtype == ()


def test_a_profile_may_keep_regions_as_written_or_not():
    assert ort.CUDA_SPEC.keep_unfused is True
    assert ort.CUDA_SPEC.with_profile({"target": "ort", "keep_unfused": False}).keep_unfused is False
    assert ort.CUDA_SPEC.with_profile({"target": "ort"}).keep_unfused is True


def test_a_profile_given_with_a_provider_refits_that_providers_costs(tmp_path):
    """``--profile`` beside ``--provider CUDAExecutionProvider`` refits the CUDA variant (its ops, the types they
    run in, its choice to keep a block as written), not the CPU's."""
    from egfuse.commands.cli import _profiled

    path = _profile(tmp_path, ops={"mha@bfloat16": SLOW})
    cuda = _profiled("ort", path, ("CUDAExecutionProvider",))
    cpu = _profiled("ort", path, ("CPUExecutionProvider",))
    assert cuda.keep_unfused is True and cpu.keep_unfused is False
    assert cuda.op_for("mha").speed({"bfloat16"}) == (0.01, 1000.0)
    assert cuda.op_for("mha").dtypes >= {"bfloat16"}
    assert cuda.description == ort.CUDA_SPEC.description
