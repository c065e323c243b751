"""Does an optimized model compute what the original does? Judged as egfuse's validation judges, so that the
property tests and the experiments hold every tool's output to one standard."""

from __future__ import annotations

import numpy as np
import onnx

from egfuse.validation import validate
from egfuse.validation.inputs import is_redraw


def disagreements(original: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[str]:
    """Where ``optimized`` differs from ``original`` on ``feeds`` and on each of their mask-exercising sets
    (heavy padding on both sides, random masks, a row masked entirely, a float mask written additively): one
    line per differing output. NaN is not compared where the original defines nothing (mask sets); a wider
    evaluation decides where rounding does. A half-precision model needs only finite values in half and its
    float32 copies must agree, on every set: ``feeds`` with left padding under a causal mask already hide
    every key of a query row, and such a row is the rounding of its scores against a finite fill — where the
    graph adds the fill in float32 after a Cast and a fused kernel in float16, they differ by what float16
    makes of −1e4 + score, not by meaning (egfuse's own validation judges half-precision rounding on feeds
    whose masks hide no whole row). Feed sets the original does not run on say nothing."""
    half = any(  # a float16 model fed token ids only (T5's encoder) is half precision by its outputs
        i.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        for i in [*original.graph.input, *original.graph.output]
    )
    found: list[str] = []
    for label, data in {"base": feeds, **validate.mask_feed_sets(feeds)}.items():
        masks = label != "base"
        found += _differences(original, optimized, data, label, masks, half)
        if half and not is_redraw(label):  # redraws ask finiteness only; the first large set judges meaning
            wide = [validate.upcast(m, fills=True) for m in (original, optimized)]
            copies = validate.upcast_feeds(data, fills=True)
            found += _differences(*wide, copies, f"{label}, float32 copies", True, copies=True)
    return found


def _differences(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    feeds: dict,
    label: str,
    masks: bool,
    finite_only: bool = False,
    *,
    copies: bool = False,
) -> list[str]:
    try:
        expected = validate.run(original, feeds)
    except Exception:
        return []
    try:
        actual = validate.run(optimized, feeds)
    except Exception as error:
        return [f"{label}: the optimized model does not run: {str(error).strip().splitlines()[-1][:160]}"]
    names = list(expected)
    reference = {}
    if not validate.reference_unread(expected, finite_only):
        reference = {
            **validate.references(original, feeds, expected, names, float32_too=True),
            **validate.references(original, feeds, expected, names),
        }
    found = []
    fill = validate.largest_fill(original, feeds)
    for name in names:
        if name not in actual:
            found.append(f"{label}: {name} missing")
            continue
        how = {"where_defined": masks, "finite_only": finite_only, "fill": fill, "copy_of_half": copies}
        cmp = validate.compare(name, expected[name], actual[name], reference.get(name), **how)
        if not cmp.ok:
            found.append(f"{label}: {name} differs by {cmp.max_abs_diff:.3g}")
    return found
