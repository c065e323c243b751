"""A boolean mask's convention is not in its type: transformers' True keeps a key, torch's ``key_padding_mask``
and ``attn_mask`` True hide one. The base feeds hold every fused region to the original exactly, so no row of a
generated boolean mask may be all one value (read the other way, it would hide every key: the original gives
NaN there and a fused op 0, and a correct region was rolled back as "differs by inf"); fully masked rows are
drawn on purpose, and judged as the original defines them, in the mask-exercising feed sets."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import egfuse
from egfuse.validation.inputs import make_feeds

from ..conftest import DATA, assert_same_outputs

ENCODER = DATA / "producers" / "torch" / "encoder_post.dynamo.onnx"


def _batch_renamed(path, name: str) -> onnx.ModelProto:
    """The export with its batch dim renamed: a name that says nothing binds to a batch of 5, whose middle rows
    the padding pattern leaves unpadded (torch's exporter names an unnamed dynamic dim ``s0``)."""
    model = onnx.load(path)
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "batch":
                dim.dim_param = name
    return model


def test_every_row_of_a_generated_boolean_mask_holds_both_values():
    feeds = make_feeds(_batch_renamed(ENCODER, "s0"))
    mask = feeds["key_padding_mask"]
    assert mask.dtype == np.bool_ and mask.shape[0] > 2, mask.shape
    assert mask.any(axis=-1).all() and (~mask).any(axis=-1).all(), mask


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_torchs_padding_convention_fuses_on_generated_feeds(target):
    """nn.TransformerEncoder with ``src_key_padding_mask`` (True = padding), its batch bound to 5."""
    model = _batch_renamed(ENCODER, "s0")
    result = egfuse.fuse(model, target=target)
    report = result.report
    assert report.fused == len(report.regions) == 2 and report.validated, str(report)
    assert report.fused_ops() == {"Attention": 2}, report.fused_ops()
    feeds = dict(np.load(str(ENCODER).replace(".onnx", ".feeds.npz")))
    assert_same_outputs(model, result.model, feeds)
