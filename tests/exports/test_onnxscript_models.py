"""onnxscript ships real fusion test graphs (``onnxscript/rewriter/models``): encoders and decoders (causal,
GQA, RoPE, KV cache) fuse and validate the same way as our own exports — ``_phi4lm`` included, whose 6.8 GB
of weights are ``Constant`` nodes, past protobuf's 2 GB limit."""

from __future__ import annotations

import concurrent.futures
import gc
import inspect
import multiprocessing

import numpy as np
import onnx
import pytest

import egfuse

from ..conftest import fused_op_count, one_target_fast

models = pytest.importorskip("onnxscript.rewriter.models", reason="onnxscript is in the dev extra")
import onnx_ir as ir  # noqa: E402
from onnxscript.rewriter.models import (  # noqa: E402
    _bart_encoder,
    _phi2lm,
    _phi4lm,
    _smollm_1,
    _smollm_2,
    _whisper_decoder,
    _whisper_encoder,
)

from egfuse.validation import validate  # noqa: E402

CASES = {
    "bart_encoder": (_bart_encoder._BartEncoderTest, 2),
    "whisper_encoder": (_whisper_encoder._WhisperEncoderTest, 1),
    "whisper_decoder": (_whisper_decoder._WhisperDecoderTest, 2),
    "smollm_1": (_smollm_1._SmollmTest1, 1),
    "smollm_2": (_smollm_2._SmollmTest2, 1),
    "phi2lm": (_phi2lm._Phi2LMTest, 1),
}


# The decoders of LLM size (1-1.4 GB of random weights each; a minute a target) run with ``-m slow`` (CI does);
# the others each on one target in the fast suite (the targets alternating), on the other with ``-m slow``.
LARGE = {"smollm_1", "smollm_2", "phi2lm"}
SMALL = [n for n in sorted(CASES) if n not in LARGE]
PARAMS = one_target_fast([(n,) for n in SMALL], SMALL) + [
    pytest.param(t, n, marks=pytest.mark.slow, id=f"{t}-{n}") for n in sorted(LARGE) for t in ("ort", "onnx")
]


@pytest.mark.parametrize(("target", "name"), PARAMS)
def test_models_fuse(name, target):
    test_cls, blocks = CASES[name]
    case = test_cls()
    model = ir.serde.serialize_model(case.get_onnx_model())
    # _phi2lm ships no inputs: generated ones (padded masks, in-range token ids) as validation uses
    feeds = case.get_ort_inputs() if hasattr(case, "get_ort_inputs") else validate.make_feeds(model)
    result = egfuse.fuse(model, target=target, feeds=feeds)
    assert result.report.fused == blocks == len(result.report.regions), str(result.report)
    assert result.report.validated is True
    assert fused_op_count(result.model, target) == blocks
    # their RoPE (smollm: rotate-half; phi2: 32 of 80 features) becomes RotaryEmbedding, every one of them
    assert all(r.status == "fused" for r in result.report.rotary), str(result.report)
    # validation's criterion (1e-4 + 1e-3 relative): the decoders' logits run into the tens
    comparisons = validate.compare_models(model, result.model, feeds)
    assert all(c.ok for c in comparisons.values()), comparisons


# --- _phi4lm: two Phi-4 layers at full width (hidden 5120, 40 query / 10 kv heads, vocabulary 100352) ----------

PHI4_MEMORY = 22 << 30
"""The machine the phi4 test needs (ours has 23.5 GiB): the model (6.8 GB), onnxruntime's temporaries running
it (4.6 GB: the transposed lm_head alone is 2 GB) and its weights mapped from disk (6.8 GB); building it
peaks at twice its size. The model and its fused result are never held at once, nor its weights twice."""


PHI4_VALIDATION_BYTES = 8 << 30
"""What validating phi4 holds beside its mapped weights: the 4.6 GB above, with room."""


def _memory() -> int:
    try:
        with open("/proc/meminfo") as info:
            fields = dict(line.split(":", 1) for line in info)
        return int(fields["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0


def _phi4lm_model() -> onnx.ModelProto:
    """onnxscript's own graph (``make_model``) with float32 weights at a trained model's scale, drawn directly:
    its ``make_model_with_random_weights`` draws float64 in [0, 1) and casts (4 GB more at the peak, and
    activations thousands of times larger than a real model's)."""
    rng = np.random.default_rng(0)
    weights = []
    for name in inspect.signature(_phi4lm.make_model).parameters:
        shape = _phi4lm.value_infos[name].shape
        weight = rng.standard_normal((shape,) if isinstance(shape, int) else tuple(shape), dtype=np.float32)
        weight *= 0.02
        weights.append(weight)
    model = _phi4lm.make_model(*weights)
    del weights, weight
    gc.collect()  # onnxscript's script() holds the arrays (6.8 GB) in a reference cycle until collected
    return model


def _fuse_phi4lm(target: str) -> dict:
    """Build, fuse and check phi4 in a process of its own (the test's): what it returns is small. One process
    per target, because memory freed in a process is not all given back to the system, and a second model
    in the same process does not fit."""
    model = _phi4lm_model()
    constants = sum(n.op_type == "Constant" for n in model.graph.node)
    feeds = validate.make_feeds(model)
    expected = validate.run(model, feeds)  # the unfused model, run before fusion so both are never held at once
    outputs_before = [o.name for o in model.graph.output]
    # onnxruntime folds the transposed weights (4.6 GB, over the 4 GiB default) when it loads the model
    budgets = egfuse.Budgets(validation_bytes=PHI4_VALIDATION_BYTES)
    result = egfuse.fuse(model, target=target, feeds=feeds, budgets=budgets)
    del model  # from here only the result holds weights
    graph = result.model.graph
    facts = {
        "constants": constants,
        "report": result.report,
        "outputs_before": outputs_before,
        "outputs": [o.name for o in graph.output],
        "attention": [list(n.output) for n in graph.node if n.op_type == "Attention" and n.domain == ""],
        "inline": all(t.data_location != onnx.TensorProto.EXTERNAL for t in graph.initializer),
    }
    actual = validate.run(result.model, feeds)
    facts["comparisons"] = [validate.compare(name, expected[name], actual[name]) for name in outputs_before]
    return facts


@pytest.mark.slow
def test_phi4lm_fuses_with_native_kv_heads(target):
    """The whole pipeline runs on the graph without its weights (written once to a file onnxruntime maps);
    every attention fuses with its 10 kv heads native, every RoPE becomes RotaryEmbedding, the present
    key/values come from the fused op, and the result agrees with the model on onnxruntime (run here, apart
    from egfuse's own validation)."""
    if _memory() < PHI4_MEMORY:
        pytest.skip(f"needs a machine with {PHI4_MEMORY >> 30} GiB of memory, this one has {_memory() / (1 << 30):.1f}")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        facts = pool.submit(_fuse_phi4lm, target).result()
    report = facts["report"]
    assert facts["constants"] > 100  # weights as Constant nodes, as onnxscript ships it
    assert report.fused == 2 == len(report.regions), str(report)
    assert report.validated is True, str(report)
    assert len(report.rotary) == 4 and all(r.status == "fused" for r in report.rotary), str(report)
    # both targets write the standard op, which takes grouped heads natively; its present key/value are the
    # graph's (B, 10, T, 128) outputs, so K and V reach it with their 10 kv heads, not repeated to 40
    assert len(facts["attention"]) == 2
    assert all(out[1] in facts["outputs"] and out[2] in facts["outputs"] for out in facts["attention"])
    assert facts["outputs"] == facts["outputs_before"]
    assert facts["inline"]  # the weights are back in the result
    assert all(c.ok for c in facts["comparisons"]), facts["comparisons"]
