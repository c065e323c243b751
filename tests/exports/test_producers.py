"""Producers other than transformers + torch.onnx (``experiments/producers_keras.py``,
``experiments/producers_timm.py``, ``experiments/producers_diffusers.py``, committed under
tests/data/producers/<producer>/): Keras 3 models through tf2onnx and through keras' own ``model.export``, timm
vision transformers, open_clip, diffusers (UNet cross-attention, DiT, SD3/SD3.5 joint attention, Flux) and torch's
own modules (``nn.MultiheadAttention``, ``nn.TransformerEncoder``/``Decoder``, ``F.scaled_dot_product_attention``
with ``enable_gqa``: ``experiments/producers_torch.py``) through both torch exporters, and optimum's merged
decoders (``experiments/merged_decoders.py``: every block inside an ``If``'s branches). Every export fuses the
blocks the framework counted — or, for the blocks listed in :data:`KNOWN_GAPS`, exactly as many as said there and
why — validated by egfuse's generated inputs, and the result matches the original on the export's own feeds.

Each export runs on one target, alternating (both targets and npu are measured by
``experiments/drift_coverage.py --corpus tests/data/producers``); one in forty runs in the fast suite, the rest
in the slow one (``-m slow``, which CI runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import egfuse

from ..conftest import DATA, assert_same_outputs

PRODUCERS = sorted(p.parent for p in (DATA / "producers").glob("*/manifest.json"))

_TALKING_HEADS = (
    "talking-heads attention mixes the heads by a linear map before and after the softmax: no attention "
    "op computes it (the class-attention block fuses)"
)
_FACTORIZED = "factorized attention: a softmax over the keys' token axis and Kᵀ·V first, no N×N scores"
KNOWN_GAPS: dict[str, tuple[int, str]] = {
    **{f"cait_{a}.{e}.onnx": (1, _TALKING_HEADS) for a in ("eager", "fused") for e in ("torchscript", "dynamo")},
    **{f"coat_eager.{e}.onnx": (0, _FACTORIZED) for e in ("torchscript", "dynamo")},
}
"""Per export file, the blocks egfuse fuses where it is fewer than the framework counted, and why. A gap that
closes (or widens) fails the test until it is updated here."""


def _entries() -> list[tuple[Path, dict]]:
    return [
        (producer, entry)
        for producer in PRODUCERS
        for entry in json.loads((producer / "manifest.json").read_text())["models"]
        if entry["file"] and not entry["error"]
    ]


def _cases() -> list:
    cases = []
    for i, (producer, entry) in enumerate(_entries()):
        target = ("ort", "onnx")[i % 2]
        marks = [] if i % 40 == 3 else [pytest.mark.slow]
        cases.append(pytest.param(producer, entry, target, marks=marks, id=f"{producer.name}-{target}-{entry['file']}"))
    return cases


def test_the_corpus_has_every_producer():
    """Keras through both routes, timm, diffusers and torch's own modules, each with a manifest of versions; a
    bare clone has them (committed)."""
    names = {p.name for p in PRODUCERS}
    assert {"keras_tf2onnx", "timm", "diffusers", "torch", "optimum_merged"} <= names, names
    for producer in PRODUCERS:
        assert json.loads((producer / "manifest.json").read_text())["models"], producer.name


@pytest.mark.parametrize(("producer", "entry", "target"), _cases())
def test_every_block_fuses_and_matches(producer: Path, entry: dict, target: str):
    path = producer / entry["file"]
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    result = egfuse.fuse(path, target=target)
    report = result.report
    expected, why = KNOWN_GAPS.get(entry["file"], (entry["blocks"], ""))
    assert report.fused == expected, f"{why}\n{report}"
    assert report.validated is not False, str(report)
    assert_same_outputs(onnx.load(path), result.model, feeds)


@pytest.mark.parametrize("export", ["eva_eager.torchscript.onnx", "eva_fused.torchscript.onnx",
                                    "eva_eager.dynamo.onnx", "eva_fused.dynamo.onnx"])  # fmt: skip
def test_evas_side_by_side_tables_are_its_rotations_tables(export):
    """timm's EVA stores sin and cos side by side in one (S, 2R) buffer, each repeat_interleave'd, splits it, and
    multiplies the (B, N, S, R) query and key by the (S, R) pieces with no Unsqueeze: the pieces of a constant
    are constants whose entries repeat in pairs, an even piece of interleaved pairs is the interleave of the
    pieces half as wide, and an (S, R) table broadcasts as the table with the heads axis added — so the op
    reads them (unsqueezed to (1, S, R/2) and expanded to the batch). Before, every rotation stayed: "the sin
    table is not repeat_interleave(t, 2)". The dynamo exports rotate the patch tokens only, a Slice of the
    sequence axis, and concatenate the class token back in front: that Concat is the graph's, after the
    rotation, not a partial rotation's features put back (which it was read as: "the rotated part is not
    concatenated back with x[..., R:]")."""
    path = DATA / "producers" / "timm" / export
    if not path.exists():
        pytest.skip(f"{path.name} is not in this checkout")
    result = egfuse.fuse(path, target="onnx")
    report = result.report
    assert report.validated is True and report.rotary, str(report)
    assert all(r.status == "fused" for r in report.rotary), str(report)
    assert sum(n.op_type == "RotaryEmbedding" for n in result.model.graph.node) == len(report.rotary)
    feeds = dict(np.load(path.with_name(path.name.replace(".onnx", ".feeds.npz"))))
    assert_same_outputs(onnx.load(path), result.model, feeds)
