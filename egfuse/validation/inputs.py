"""The inputs validation runs on, built so attention is exercised as in real use: symbolic dims bound to
small distinct sizes (or to the relations between them a graph needs: :mod:`egfuse.validation.dim_bindings`), integer
masks with real padding (0s at the end of the last sequence and, left padding, at the start of the first), token
ids inside the embedding table — and further feed sets whose masks pad heavily, at random, or additively."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import numpy.random  # numpy 2 loads its random module on first use: 8 ms inside the first validation
import onnx

from egfuse.validation.dim_bindings import bind_dim, input_dims, long_dims, related_bindings, unnamed_batches

__all__ = [
    "HALF_DRAW_FACTORS",
    "HALF_LARGE_DRAWS",
    "LARGE_SCALE",
    "LARGE_SCORES",
    "WHOLE_ROW",
    "bind_dim",
    "input_dims",
    "is_redraw",
    "long_dims",
    "make_feeds",
    "mask_feed_sets",
    "related_bindings",
]


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int | None:
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def make_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {**unnamed_batches(model), **(dims or {})}
    init_names = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        tt = inp.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else bind_dim(d.dim_param or f"unk_{inp.name}_{i}", sizes)
            for i, d in enumerate(tt.shape.dim)
        ]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        name = inp.name.lower()
        if np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16:
            data = rng.standard_normal(shape).astype(dtype)
            if "mask" in name:
                data = _padding(shape).astype(dtype)
        elif dtype == np.bool_:
            data = _both_values_in_each_row(_padding(shape).astype(bool))
        elif "mask" in name:
            data = _padding(shape).astype(dtype)
        elif "position" in name and shape:
            data = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        else:
            high = _vocab_size(model, inp.name) or 2
            data = rng.integers(0, high, size=shape).astype(dtype)
        feeds[inp.name] = data
    return feeds


WHOLE_ROW = "a row fully masked"
"""The label of the feed set whose batch row 0 has every key masked."""
LARGE_SCORES = "large scores"
"""The label of the feed set with the float inputs scaled by :data:`LARGE_SCALE` on the most masked keys."""
LARGE_SCALE = 4.0
"""How much larger the float inputs of the :data:`LARGE_SCORES` set are: scores that Q and K both scale grow
16×, past what a finite fill absorbs (S − 1e9 rounds back to −1e9 in float32 only for |S| < 32). A query row
whose keys a select fill replaces entirely is uniform in the graph; a fused op that adds the scores to a
finite fill instead is uniform only while the fill absorbs them — standard-normal feeds rarely make scores
that large, so without this set such a rewrite could validate and still change what the row computes."""


HALF_LARGE_DRAWS = 4
"""How many :data:`LARGE_SCORES` sets a half-precision model is run on: the first, then the same inputs times
:data:`HALF_DRAW_FACTORS` drawn per element (signs afresh, so the scores are drawn afresh, 16× larger again).
In half precision a score overflows against a finite fill (``S + finfo.min`` is −inf once S < −16), so what a
fully masked row computes turns on the sign of the scores it hides: a fused op that makes such a row
non-finite showed on one seed in three or four with the first set alone (three blocks, 30 seeds each)."""
HALF_DRAW_FACTORS = np.array([-4.0, 4.0])


def is_redraw(label: str) -> bool:
    """A half-precision model's further :data:`LARGE_SCORES` draws: judged for finiteness alone (the first set
    also judges the masks' meaning on float32 copies)."""
    return label.startswith(f"{LARGE_SCORES} (draw ")


def mask_feed_sets(feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Further feeds, the base ``feeds`` with only their masks changed, so what a fused region does with a mask
    is exercised and not just present: many padded positions (row 0 padded on the left over half its keys, the
    last row on the right), random masks (each row keeping at least one key), a batch row whose every key is
    padding, and — for a float mask, whose convention a name does not tell — the same padding written
    additively (0 and finfo.min), which also masks every key of some query rows under a causal mask; and
    the most masked of those with the float inputs :data:`LARGE_SCALE` times larger (:data:`LARGE_SCORES`;
    :data:`HALF_LARGE_DRAWS` such sets for a half-precision model). Empty when the model takes no mask.

    A query row whose every key is masked means what the graph computes for it: in float32 the fill absorbs
    the scores (``S + finfo.min`` rounds to the fill, and so does ``S − 1e30``), so the row is uniform and its
    output the mean of V; with a −inf fill it is NaN, and entries the original leaves NaN are not compared.
    A fused op must give the same, so the batch row masked entirely is drawn (:data:`WHOLE_ROW`). In half
    precision the fill absorbs only scores within a few ulps of it (|S| < 16 for float16's finfo.min): the
    graph's answer there is the softmax of scores rounded against the fill, which no kernel is bound to
    reproduce (onnxruntime's float16 ``Attention`` computes the masked softmax in float32). Every set here
    can make such rows (heavy left padding under a causal mask hides every key of the first queries), so on
    all of them a half-precision output is only required to be finite in the rows where the original is (a NaN or
    −inf row is still caught; :func:`egfuse.validation.validate.compare`), and the masks are judged on float32 copies
    of both models (:mod:`egfuse.validation.judge`); the base feeds judge the half-precision rounding."""
    masks = {name: value for name, value in feeds.items() if _is_mask_input(name, value)}
    if not masks:
        return {}
    rng = np.random.default_rng(7)
    sets: dict[str, dict[str, np.ndarray]] = {"heavy padding": {}, "random masks": {}}
    additive: dict[str, np.ndarray] = {}
    whole_row = _batch(masks) > 1
    if whole_row:
        sets[WHOLE_ROW] = {}
    for name, value in masks.items():
        heavy, random = _heavy_padding(value.shape), _random_mask(value.shape, rng)
        sets["heavy padding"][name] = heavy.astype(value.dtype)
        sets["random masks"][name] = random.astype(value.dtype)
        if whole_row:
            sets[WHOLE_ROW][name] = _row_masked(heavy, value.dtype)
        if np.issubdtype(value.dtype, np.floating):
            additive[name] = np.where(heavy > 0, 0.0, np.finfo(value.dtype).min).astype(value.dtype)
    if additive:
        sets["additive padding"] = additive
    scaled = {
        name: (value * LARGE_SCALE).astype(value.dtype)
        for name, value in feeds.items()
        if name not in masks and np.issubdtype(np.asarray(value).dtype, np.floating)
    }
    if scaled:  # the most masked keys there are, with the scores LARGE_SCALE² as large (Q and K scale alike)
        most_masked = sets.get(WHOLE_ROW, sets["heavy padding"])
        sets[LARGE_SCORES] = {**most_masked, **scaled}
        if any(np.finfo(np.asarray(value).dtype).bits <= 16 for value in scaled.values()):
            signs = np.random.default_rng(11)
            for draw in range(2, HALF_LARGE_DRAWS + 1):
                flipped = {
                    name: (value * signs.choice(HALF_DRAW_FACTORS, size=value.shape)).astype(value.dtype)
                    for name, value in scaled.items()
                }
                sets[f"{LARGE_SCORES} (draw {draw})"] = {**most_masked, **flipped}
    return {label: {**feeds, **changed} for label, changed in sets.items()}


def _batch(masks: dict[str, np.ndarray]) -> int:
    return min(value.shape[0] if value.ndim >= 2 else 1 for value in masks.values())


def _row_masked(heavy: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The heavy padding with batch row 0 padded over every key; a float mask written additively (0 and
    finfo.min: a 0/1 float mask that the graph adds would mask nothing)."""
    mask = heavy.copy()
    mask[0] = 0
    if np.issubdtype(dtype, np.floating):
        return np.where(mask > 0, 0.0, np.finfo(dtype).min).astype(dtype)
    return mask.astype(dtype)


def _is_mask_input(name: str, value: np.ndarray) -> bool:
    return value.ndim >= 1 and value.shape[-1] > 1 and (value.dtype == np.bool_ or "mask" in name.lower())


def _heavy_padding(shape: tuple[int, ...]) -> np.ndarray:
    """1 = attend: row 0 padded on the left over half its keys, the last row on the right over half."""
    mask = np.ones(shape)
    half = max(1, shape[-1] // 2)
    if len(shape) >= 2:
        mask[0, ..., :half] = 0
        if shape[0] > 1:
            mask[shape[0] - 1, ..., shape[-1] - half :] = 0
    else:
        mask[shape[-1] - half :] = 0
    return mask


def _random_mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    mask = (rng.random(shape) < 0.6).astype(np.float64)
    mask[..., 0] = 1  # every row keeps a key: a row with none means what each convention makes of it
    return mask


def _both_values_in_each_row(mask: np.ndarray) -> np.ndarray:
    """A boolean mask whose every row (last axis) holds a True and a False: its convention is not in its type
    (transformers' True keeps a key, torch's ``key_padding_mask`` and ``attn_mask`` True hide one), so a row of
    one value would, read the other way, hide every key — and the base feeds are where a fused op is held to
    the original everywhere (fully masked rows are drawn on purpose, and judged as such, in
    :func:`mask_feed_sets`). A row of all True loses its last key."""
    if mask.ndim == 0 or mask.shape[-1] < 2:
        return mask
    mask = mask.copy()
    uniform = mask.all(axis=-1) | ~mask.any(axis=-1)
    mask[uniform, -1] = ~mask[uniform, -1]
    return mask


def _padding(shape: list[int]) -> np.ndarray:
    """1 = attend, 0 = padding; the last row of the batch has its final position padded and, in a batch of
    more than one, the first row its first position (left padding, as batched generation pads: under a
    causal mask that query row sees nothing but padding, the case kernels answer differently) — its first
    two where the sequence is longer than two, so some padded keys are also causally masked: a padded key
    a causal select already masked is where a select (finfo.min) and a sum (finfo.min + finfo.min = −inf)
    disagree."""
    mask = np.ones(shape)
    if len(shape) >= 2 and shape[-1] > 1:
        mask[shape[0] - 1, ..., shape[-1] - 1] = 0
        if shape[0] > 1:
            mask[0, ..., : 2 if shape[-1] > 2 else 1] = 0
    elif len(shape) == 1 and shape[0] > 1:
        mask[-1] = 0
    return mask
