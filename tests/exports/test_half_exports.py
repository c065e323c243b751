"""float16 exports (torch's dynamo exporter at opset 18: a BERT, a Llama with grouped K/V heads and RoPE, and the
Llama's decode step over a KV cache, built by ``experiments/corpus.py --set half``): every attention block, norm,
GELU and rotation fuses and validates. Before, nothing did: the softmax and the norms that transformers computes
in float32 between casts were not read as themselves (``rules/precision.py``), GELU's √2 stored in float16 was
not √2 (``rules/gelu.py``), and validation rolled every attention block back because a query row whose every key
is masked has two correct half-precision values (``validate.fill_decided``). Gemma 3's norms compute in
float32 from float16 values and carry their rounding: judged at float32's tolerance, 10 of its 13 were rolled
back; they are judged at float16's precision (``validate.compare``'s ``precision``)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.targets import ort
from egfuse.testing import disagreements
from egfuse.validation import validate

from ..conftest import DATA, one_target_fast, with_output_scaled

HALF = DATA / "half"
MODELS = [
    m for m in json.loads((HALF / "manifest.json").read_text())["models"] if m["file"] and "float16" in m["flavour"]
]
"""The float16 exports (the bfloat16 ones beside them: tests/exports/test_bfloat16_exports.py)."""
CASES = one_target_fast([(m,) for m in MODELS], [m["file"] for m in MODELS])
"""Each export on one target in the fast suite (the targets alternating), on the other with ``-m slow``."""


def _feeds(entry: dict) -> dict[str, np.ndarray]:
    return dict(np.load(HALF / entry["file"].replace(".onnx", ".feeds.npz")))


def _unpadded(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same feeds with nothing padded: every row has a meaning to compare."""
    return {k: np.ones_like(v) if k == "attention_mask" else v for k, v in feeds.items()}


def test_the_half_corpus_is_float16():
    # BERT, Llama, its decode step, MPT (scores upcast before a float32 ALiBi bias), Gemma 3 (Q and K normed),
    # Cohere, ERNIE 4.5, OLMo 2, ModernBERT (norms and rotations in float32 between casts, each its own way)
    assert len(MODELS) == 9
    for entry in MODELS:
        model = onnx.load(HALF / entry["file"], load_external_data=False)
        assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16, entry["file"]


@pytest.mark.parametrize(("target", "entry"), CASES)
def test_every_block_and_layer_op_fuses_and_validates(entry, target):
    path, feeds = HALF / entry["file"], _feeds(entry)
    result = egfuse.fuse(path, target=target, feeds=feeds)
    report = result.report
    assert report.fused == entry["blocks"] == len(report.regions), str(report)
    assert report.validated is True, str(report)
    assert report.layer_ops and all(r.status == "fused" for r in report.layer_ops), str(report)
    rotations = 2 * entry["blocks"] if "rope" in entry["flavour"] else 0
    assert [r.status for r in report.rotary] == ["fused"] * rotations, str(report)
    ops = {n.op_type for n in result.model.graph.node}
    assert "Softmax" not in ops and "Erf" not in ops and "ReduceMean" not in ops, sorted(ops)
    original = onnx.load(path)
    # The judge every tool is held to (each mask set, float32 copies for what the masks mean) ...
    assert disagreements(original, result.model, feeds) == []
    # ... and, on rows that all mean something, within float16's rounding of the original.
    plain = _unpadded(feeds)
    expected, actual = validate.run(original, plain), validate.run(result.model, plain)
    for name, e in expected.items():
        scale = float(np.abs(e.astype(np.float64)).max())
        diff = float(np.abs(e.astype(np.float64) - actual[name].astype(np.float64)).max())
        assert diff <= 2e-2 * max(scale, 1.0), (name, diff, scale)


def test_the_npu_target_splits_the_float16_heads():
    entry = next(m for m in MODELS if m["name"] == "llama_sdpa_fp16")
    result = egfuse.fuse(HALF / entry["file"], target="npu", feeds=_feeds(entry))
    assert result.report.fused == entry["blocks"] and result.report.validated is True, str(result.report)
    assert disagreements(onnx.load(HALF / entry["file"]), result.model, _feeds(entry)) == []


def test_a_float32_mask_beside_float16_scores_goes_only_to_the_standard_op():
    """MPT upcasts its float16 scores to add a float32 ALiBi bias and select: onnxruntime's contrib ops take a
    bias of Q's type only (CUDA's costs chose MultiHeadAttention, the fused model did not load and validation
    rolled everything back), and rounding that mask to float16 would change it; the standard op's mask type is
    free. Priced for CUDA and made to fuse wherever it can, the ort target writes the standard op."""
    entry = next(m for m in MODELS if m["name"] == "mpt_eager_fp16")
    forced = replace(ort.CUDA_SPEC, keep_unfused=False)
    result = egfuse.fuse(onnx.load(HALF / entry["file"]), target=forced, feeds=_feeds(entry))
    assert result.report.fused == entry["blocks"] and result.report.validated is True, str(result.report)
    assert [r.fused_into for r in result.report.regions] == ["Attention"] * entry["blocks"], str(result.report)
    assert not [n for r in result.report.regions for n in r.notes if "did not validate" in n], str(result.report)


def _unfolded_norms(model: onnx.ModelProto, widths: tuple[int, ...]) -> onnx.ModelProto:
    """``model``'s norms as an export that folds nothing spells Gemma 3's ``(norm(x.float()) · (1 +
    w.float())).type_as(x)`` (torch's ``optimize=False``): each float32 weight (a folded ``1 + w``, one value per
    feature) computed in the graph from a float16 ``w``, and each narrowing ``Cast`` after one a ``CastLike``.
    The norms' region then ends at the float32 product: a float32 ``RMSNormalization`` between the graph's
    casts."""
    rng = np.random.default_rng(0)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    like = onnx.numpy_helper.from_array(np.array(0.0, np.float16), "half_like")
    one = onnx.numpy_helper.from_array(np.array(1.0, np.float32), "gamma_one")
    computed, kept, gammas = [], [one, like], set()
    for init in out.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or list(init.dims) not in ([w] for w in widths):
            kept.append(init)
            continue
        w = (0.1 * rng.standard_normal(init.dims[0])).astype(np.float16)
        kept.append(onnx.numpy_helper.from_array(w, f"{init.name}_w"))
        computed += [
            onnx.helper.make_node("Cast", [f"{init.name}_w"], [f"{init.name}_wide"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("Add", [f"{init.name}_wide", "gamma_one"], [init.name]),
        ]
        gammas.add(init.name)
    assert computed, "no norm weight found"
    scaled = {o for n in out.graph.node if n.op_type == "Mul" and gammas & set(n.input) for o in n.output}
    nodes = []
    for node in out.graph.node:
        if node.op_type == "Cast" and node.input[0] in scaled:
            node = onnx.helper.make_node("CastLike", [node.input[0], "half_like"], list(node.output), node.name)
        nodes.append(node)
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    del out.graph.node[:]
    out.graph.node.extend([*computed, *nodes])
    return out


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_norms_computed_in_float32_from_float16_values_are_judged_at_float16s_precision(target):
    """A float32 norm between casts in a float16 model (Gemma 3 exported without folding) carries its float16
    input's rounding: an attention op rounds its output differently from the primitive ops, by an ulp, and that
    is 1e-3 of the norm's output — the float32 tolerance. Judged at float32's tolerance, 10 of the 13 norms
    were rolled back; judged at the model's precision, every norm fuses, and the judge every tool is held to
    finds nothing."""
    entry = next(m for m in MODELS if m["name"] == "gemma3_sdpa_fp16")
    widths = (entry["head_dim"], entry["heads"] * entry["head_dim"])
    original = _unfolded_norms(onnx.load(HALF / entry["file"]), widths)
    result = egfuse.fuse(original, target=target, feeds=_feeds(entry))
    report = result.report
    assert report.fused == entry["blocks"] and report.validated is True, str(report)
    norms = [n for n in result.model.graph.node if n.op_type == "RMSNormalization"]
    assert len(norms) == 13 and all(r.status == "fused" for r in report.layer_ops), str(report)
    assert disagreements(original, result.model, _feeds(entry)) == []


@pytest.mark.parametrize("fault", ["output 1% large", "epsilon 0.1"])
def test_a_float32_norm_in_a_float16_model_off_by_a_fault_is_still_rolled_back(fault):
    """Judged at float16's precision, a norm is still held to its meaning: every one of the 13 norms, put 1% off
    or given a wrong ε in the fused model, fails validation (the judge ``egfuse.fuse`` applies, on generated
    feeds)."""
    from egfuse.validation.judge import judge

    entry = next(m for m in MODELS if m["name"] == "gemma3_sdpa_fp16")
    original = _unfolded_norms(onnx.load(HALF / entry["file"]), (entry["head_dim"], entry["heads"] * entry["head_dim"]))
    result = egfuse.fuse(original, target="ort", feeds=_feeds(entry))
    count = sum(n.op_type == "RMSNormalization" for n in result.model.graph.node)
    assert count == 13, str(result.report)
    for k in range(count):
        if fault == "epsilon 0.1":
            mutant = onnx.ModelProto()
            mutant.CopyFrom(result.model)
            node = [n for n in mutant.graph.node if n.op_type == "RMSNormalization"][k]
            next(a for a in node.attribute if a.name == "epsilon").f = 0.1
        else:
            mutant = with_output_scaled(result.model, "RMSNormalization", k, 1.01)
        report = copy.deepcopy(result.report)
        verdict = judge(original, mutant, report, None, None)
        assert verdict.failing or verdict.validated is not True, (fault, k)
