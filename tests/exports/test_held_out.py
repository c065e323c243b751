"""Architectures that broke egfuse on a user's model, kept as exports (``experiments/corpus.py --set held_out``,
committed under tests/data/held_out/): every block fuses on every target, validated, and the result matches the
original on the export's own feeds.

- MPT (ALiBi bias; one packed QKV projection split by Slices whose ends are computed from ``Shape``): the dynamo
  export's symbolic dims hold ``Max(0, 1 - s)``, which binding a dim for the cost model expanded forever
  (RecursionError, nothing written); on the ``onnx`` target the standard ``Attention`` on those Slices loaded as a
  (B, S, 0) output in onnxruntime, whose next MatMul refused the model.
- GLM (interleaved RoPE on half the head, its tables ``cos[..., :R/2].repeat_interleave(2)`` taken after the
  heads axis was added): the rotations were kept ("the sin table is not unsqueezed at x's heads axis") until a
  piece of the last axis was read through the new axis before it. ERNIE 4.5, GLM-4 and Helium spell it alike.
- BitNet (an RMS norm of the attention's output itself): the norm's op read the original output, so the fused
  attention op was left unused and dropped while the report said fused; validated, it was rolled back.
- ViTDet (windowed and global attention on (B·N, S, H) unbound from one (3, B·N, S, H) view; decomposed relative
  positions added to the scores viewed as (B·N, h, w, h, w); the output viewed as (B, N, h, w, H) and permuted):
  nothing fused ("recognition stopped at Squeeze") until the op was written at the attention's own output where
  the layout after it is not read back, and the view back of the scores distributed over the position terms.
  segment-anything's encoder spells it alike.
- segment-anything's vision encoder (SDPA, its relative positions as the mask, the output viewed as (B, N, h, w, H)):
  on npu, written at the attention's own output, the tail's end was rewritten too and the op's output, no
  longer read, was dropped; validation, asking for it, rolled both blocks back. The tail stays the graph's now.
- RoFormer (interleaved rotary tables read from ``sinusoidal_pos[None, None, :, :]``, split into sin and cos): the
  rotations were kept ("the sin table is not unsqueezed at x's heads axis") until a Slice from 0 to the end of an
  axis of unknown length was read as the tensor itself, and a Split of the table counted among the table's ops.
- LongT5's encoder (local attention: the sequence padded and cut into blocks, each query block reading three
  blocks' keys through ``...qhd,...khd->...hqk`` Einsums, a mask and a position bias per block): nothing fused
  ("recognition stopped at Einsum") until an Einsum's ellipsis was read as the leading axes it stands for and the
  blocked attention folded into the batch (``rules/windows.py``).
- gpt-oss (a learned logit per head concatenated to the scores, ``x − max(x)`` before the softmax, the logit's column
  cut off the probabilities; RoPE on x's halves apart, ``[x₁·c − x₂·s, x₂·c + x₁·s]``; a router's softmax a layer):
  nothing fused ("the probabilities go to Slice"), no rotation found, until the softmax's shift and the sink —
  attention over one more key, of zeros, biased by the logit (``rules/sinks.py``) — and the rotation on the halves
  were identities.
- Gemma 4 (every RMS norm written ``x · (mean x² + ε)^(−½) · γ`` with ``torch.pow`` and cast back with ``CastLike``,
  nine a layer: Q's, K's and V's among them): none was found (no ``Sqrt`` to anchor one) until the power of −½ was
  the reciprocal root (``rules/norms.py``) and anchored a norm; then the attention region still took the input
  norm's products in, until a norm's output behind ``CastLike`` was where a block starts.

Beyond the blocks, every norm, activation and rotation found fuses on ort and onnx.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.analysis.dims import Dim, evaluate
from egfuse.egraph.shapes import bind

from ..conftest import DATA, assert_same_outputs, fused_op_count

HELD_OUT = DATA / "held_out"
MANIFEST = json.loads((HELD_OUT / "manifest.json").read_text())
ENTRIES = [e for e in MANIFEST["models"] if e["file"]]


@pytest.mark.parametrize("target", ["ort", "onnx", "npu"])
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_every_block_fuses_and_matches(entry: dict, target: str):
    path = HELD_OUT / entry["file"]
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    result = egfuse.fuse(path, target=target)
    report = result.report
    kept = [r for r in report.regions if r.status != "fused"]
    routers = [r for r in kept if "moe" in entry["flavour"] and "not multiplied by V" in r.reason]  # softmax-routed
    assert len(routers) == (2 if "moe" in entry["flavour"] else 0), str(report)  # a router's softmax a layer
    kept = [r for r in kept if r not in routers]
    if target == "npu":  # single-head attentions are priced against the graph's own ops: a block may stay by cost
        assert all("predicted cheaper" in r.reason for r in kept), str(report)
    else:
        assert not kept, str(report)
    assert report.fused + len(kept) == entry["blocks"], str(report)
    assert report.validated is True, str(report)
    if any(f.startswith("rope") for f in entry["flavour"]):  # Q's and K's rotation in every layer, found
        assert len(report.rotary) == 2 * MANIFEST["layers"], str(report)
    if target != "npu":  # the npu target keeps rotations (and the GELU below opset 20), and writes one op a head
        assert all(r.status == "fused" for r in [*report.layer_ops, *report.rotary]), str(report)
        assert fused_op_count(result.model, target) == entry["blocks"], str(report)
    assert_same_outputs(onnx.load(path), result.model, feeds)


def test_a_symbolic_dim_with_a_call_binds_to_its_value():
    """torch writes ``Max(0, 1 - s)``: a call is one atom of a polynomial, so only evaluation binds it."""
    assert evaluate("Max(0, -1*s + 1)", {"s": 7}.__getitem__) == 0
    assert evaluate("Max(0, -1*s + 1)", {"s": 0}.__getitem__) == 1
    assert evaluate("2*s + past//2", {"s": 3, "past": 9}.__getitem__) == 10
    assert evaluate("open(s)", {"s": 3}.__getitem__) is None  # no call but the arithmetic ones
    assert bind(Dim.parse("Max(0, -1*s + 1)"), {"s": 7}) == 1  # a dim is at least 1
    assert bind(Dim.parse("s + 2"), {"s": 7}) == 9


def test_an_original_onnxruntime_cannot_load_is_named_so_not_its_feeds():
    """Falcon's dynamo exports (torch 2.8, 2.9) hold a Mul no onnxruntime kernel takes: the report says the model
    does not load — no feeds would help — instead of asking the user to check the feeds' shapes."""
    from onnx import TensorProto, helper

    from egfuse.testing import Variant, attention_model, feeds_for

    model = attention_model(Variant())
    feeds = feeds_for(model, seed=0)
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [2])
    model.graph.input.append(flag)
    model.graph.node.append(helper.make_node("Mul", ["flag", "flag"], ["flag_squared"]))  # no bool Mul kernel
    model.graph.output.append(helper.make_tensor_value_info("flag_squared", TensorProto.BOOL, [2]))
    feeds["flag"] = np.array([True, False])
    result = egfuse.fuse(model, target="onnx", feeds=feeds)
    assert result.report.fused == 0
    assert "does not load on this onnxruntime" in result.report.validation_note, result.report.validation_note
    assert "check their shapes" not in result.report.validation_note


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_gemma4s_norms_written_as_a_power_are_all_found_and_fused(target: str):
    """All nine RMS norms of each of Gemma 4's layers are found and fused (the test above asks that those found fuse):
    no ``Pow(·, −½)`` is left in the written model."""
    path = HELD_OUT / "gemma4_sdpa.dynamo.onnx"
    result = egfuse.fuse(path, target=target)
    norms = [r for r in result.report.layer_ops if r.kind == "layer"]  # (its tanh GELUs are the others)
    assert len(norms) == 9 * MANIFEST["layers"], str(result.report)
    assert all(r.status == "fused" and r.fused_into == "RMSNormalization" for r in norms), str(result.report)
    written = result.model.graph.node
    constants = {n.output[0]: n for n in written if n.op_type == "Constant"}
    powers = [n for n in written if n.op_type == "Pow" and n.input[1] in constants]
    assert not [n for n in powers if onnx.numpy_helper.to_array(constants[n.input[1]].attribute[0].t) == -0.5]
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    assert_same_outputs(onnx.load(path), result.model, feeds)
