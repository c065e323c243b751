"""Rewrite certificates: each fused region carries the rule applications that put its form into its class, the
certificate depends on the rules (take a needed family away and it is not reached), layers that lower alike
share one saturation, and ``egfuse explain`` prints a region's proof from a saved report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from egfuse.rules import CORE_FAMILIES
from egglog import unstable_combine_rulesets

import egfuse
from egfuse.analysis.facts import GraphFacts
from egfuse.commands.cli import main
from egfuse.commands.explain import explain
from egfuse.egraph.certify import Certifier
from egfuse.kinds.regions import find_regions
from egfuse.preparation.shape_inference import infer_shapes
from egfuse.testing import Variant, attention_model, feeds_for

from ..conftest import assert_same_outputs, fused_export

DATA = Path(__file__).parents[1] / "data"
SCALED_Q = Variant(heads=2, k_layout="transpose_0132", scale="q_mul", causal="trilu")


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_every_fused_region_has_a_certificate_reaching_its_form(target):
    model = attention_model(SCALED_Q)
    result = egfuse.fuse(model, target=target)
    assert_same_outputs(model, result.model, feeds_for(model))
    (region,) = result.report.regions
    certificate = region.certificate
    assert region.status == "fused" and certificate["form"] == region.form
    assert certificate["reached_at"] == len(certificate["steps"]) >= 2
    assert any(name.startswith("attention.") for name in certificate["rules"])
    assert any(name.startswith("commute.") for name in certificate["rules"])  # the scale moved off Q
    assert sum(sum(step.values()) for step in certificate["steps"]) == sum(certificate["rules"].values())


def _regions(model: onnx.ModelProto):
    graph = ir.serde.deserialize_model(infer_shapes(model)).graph
    facts = GraphFacts(graph)
    return facts, find_regions(graph, facts)


def test_without_a_family_it_needs_the_form_is_not_reached():
    """The certificate is the rules' work: without the scale family, a scale split as √ over Q and K never
    becomes the op's one scale, so the region's class never holds the form the full rules reach."""
    facts, (region,) = _regions(attention_model(Variant(heads=2, k_layout="transpose_0132", scale="split_sqrt")))
    everything = unstable_combine_rulesets(*CORE_FAMILIES.values())
    without = unstable_combine_rulesets(*(r for name, r in CORE_FAMILIES.items() if name != "scale"))
    full = Certifier(facts, 18, everything, 24)
    assert full.certify(full.lower(region), "mha").reached_at is not None
    partial = Certifier(facts, 18, without, 24)
    certificate = partial.certify(partial.lower(region), "mha")
    assert certificate.reached_at is None and not any(n.startswith("scale.") for n in certificate.totals())


def test_layers_that_lower_alike_share_one_saturation():
    """Whisper's two decoder layers' self-attention lower alike (the first layer's also builds the causal mask
    the second reads: those differ), so they share one saturation."""
    path = DATA / "whisper_sdpa.dynamo.onnx"
    if not path.exists():
        pytest.skip(f"{path.relative_to(DATA.parent.parent)} is not in this checkout")
    facts, regions = _regions(onnx.load(path))
    certifier = Certifier(facts, 18, unstable_combine_rulesets(*CORE_FAMILIES.values()), 24)
    lowered = [certifier.lower(r) for r in regions]
    alike = [(a, b) for i, a in enumerate(lowered) for b in lowered[i + 1 :] if a == b]
    assert len(regions) == 6 and alike
    first, second = alike[0]
    assert certifier.certify(first, "mha") is certifier.certify(second, "mha")


def test_explain_prints_a_regions_proof(tmp_path, capsys):
    model = attention_model(SCALED_Q)
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(out), "--report", str(rep), "-q"]) == 0
    capsys.readouterr()
    softmax = json.loads(rep.read_text())["regions"][0]["softmax"]
    assert main(["explain", str(rep), softmax]) == 0
    text = capsys.readouterr().out
    assert "fused →" in text and "numeric proof" in text and "passed" in text
    assert "algebraic proof" in text and "commute." in text and "attention." in text
    assert main(["explain", str(rep), "7"]) == 1
    assert "no region '7'" in capsys.readouterr().err


def test_repeated_layers_are_counted_once():
    """Whisper's two encoder layers lower alone to the same terms: one distinct region, one certificate for
    both, and the report says so; BART's layers differ (the first computes the masks the others share)."""
    whisper = fused_export("whisper_encoder_eager.dynamo.onnx", "ort")
    assert whisper.report.fused == 2 and whisper.report.stats["distinct_regions"] == 1
    assert "attention fused: 2/2 (1 distinct)" in str(whisper.report)
    first, second = (r.certificate for r in whisper.report.regions)
    assert first == second and first["reached_at"] is not None
    assert_same_outputs(
        onnx.load(DATA / "whisper_encoder_eager.dynamo.onnx"),
        whisper.model,
        dict(np.load(DATA / "whisper_encoder_eager.dynamo.feeds.npz")),
    )
    bart = egfuse.fuse(DATA / "bart_sdpa.dynamo.onnx", validate=False)
    assert bart.report.stats["distinct_regions"] == len(bart.report.regions) == 6
    assert "distinct" not in str(bart.report).splitlines()[1]


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("export", ["bert_eager.dynamo.onnx", "vit_sdpa.torchscript.onnx", "llama_eager.dynamo.onnx"])
def test_every_fused_region_of_an_export_is_certified(export, target):
    """Saturated alone, each fused region's output class comes to hold the written program: the form, inside
    the layout ops the program puts around it (a (B, N, S, H) ``attend`` is ``merge_heads(transpose(attend))``
    of a (B, S, D) output) — a certificate that only looked for the form itself in the output's class missed
    every such region."""
    result = fused_export(export, target)
    fused = [r for r in result.report.regions if r.status == "fused"]
    assert fused, str(result.report)
    for region in fused:
        assert region.certificate["reached_at"] is not None, (region.name, region.certificate)
        text = explain(result.report.to_dict(), str(region.index))
        assert region.certificate["form"] in text and "joined the class of the region's output" in text
