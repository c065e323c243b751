"""TorchScript exports at the opsets old exports have (HF's ``transformers.onnx`` and optimum wrote 11-14 for
years; ``experiments/corpus.py --set old_opsets``, committed under tests/data/old_opsets/): every block fuses on
every target, validated, and the result matches the original on the export's own feeds.

Two things stood between them and fusion, neither an attention pattern:
- onnx's data propagation does not run through older opsets' shape arithmetic (``Unsqueeze`` with its axes an
  input, opset 13), so every Reshape's output had no shape and no attention was recognised (opsets 10-13 on ort
  and npu). The shapes left unknown are taken from a copy converted to opset 18, the model keeping its own.
- Below opset 13 Softmax flattens from its axis on; onnx's converter, told nothing of the input's rank, wraps it
  in Flatten/Reshape on the way to opset 23, which hid the attention on the targets that convert (ort, onnx).
  The converter now sees the inferred shapes: axis 3 of a rank-4 input is the last, and stays a plain Softmax.
Before: ort 28, onnx 30, npu 30 of the 48 blocks of BERT, GPT-2 and Llama at opsets 10-17; after: 48 each.

GPT-NeoX's parallel residual (two LayerNorms of one input) at opset 13, with random weights: the exporter stores
the two norms' equal weights once, so the fused norms were the same node, which common-subexpression elimination
merged — and one region's output name, which validation compares it by, was gone: "the fused model failed to
run", both norms rolled back. A merged region output is named again by an Identity.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.files.load import default_opset

from ..conftest import DATA, assert_same_outputs

OLD = DATA / "old_opsets"
ENTRIES = [e for e in json.loads((OLD / "manifest.json").read_text())["models"] if e["file"]]


def test_the_corpus_holds_old_opsets():
    assert sorted({default_opset(onnx.load(OLD / e["file"], load_external_data=False)) for e in ENTRIES}) == [11, 13]


@pytest.mark.parametrize("target", ["ort", "onnx", "npu"])
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_every_block_fuses_and_matches(entry: dict, target: str):
    path = OLD / entry["file"]
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    original = onnx.load(path)
    result = egfuse.fuse(original, target=target)
    report = result.report
    assert report.fused == entry["blocks"] == len(report.regions), str(report)
    assert report.validated is True, str(report)
    if target != "npu":  # (npu writes plain ops, a Softmax a head, and keeps rotations) every softmax inside a
        assert not any(n.op_type == "Softmax" for n in result.model.graph.node)  # fused op; norms, GELU, RoPE too
        assert all(r.status == "fused" for r in [*report.layer_ops, *report.rotary]), str(report)
    assert_same_outputs(original, result.model, feeds)
