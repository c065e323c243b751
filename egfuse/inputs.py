"""The inputs validation runs on, built so attention is exercised as in real use: symbolic dims bound to
small distinct sizes (or to the relations between them a graph needs), integer masks with real padding (0s
at the end of the last sequence and, left padding, at the start of the first), token ids inside the
embedding table — and further feed sets whose masks pad heavily, at random, or additively."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx

_DIM_SIZES = {"batch": 2}
_DEFAULT_DIM = 5


def bind_dim(name: str, sizes: dict[str, int]) -> int:
    if name.strip().isdigit():  # a fixed size written as a text dim ('32', old dynamo exports): that size
        return int(name)
    if name in sizes:
        return sizes[name]
    lowered = name.lower()
    for key, size in _DIM_SIZES.items():
        if key in lowered:
            sizes[name] = size
            return size
    # A "total" length (KV cache: past + new tokens) is the sum of the past and new lengths.
    if "total" in lowered:
        past = bind_dim(next((k for k in sizes if "past" in k.lower()), "past_sequence"), sizes)
        new = bind_dim(next((k for k in sizes if "total" not in k.lower() and "past" not in k.lower()
                             and "batch" not in k.lower()), "sequence"), sizes)  # fmt: skip
        sizes[name] = past + new
        return sizes[name]
    # Sums such as "past_sequence_length + sequence_length" follow from their parts.
    parts = [p.strip() for p in re.split(r"\+", name)]
    if len(parts) > 1:
        sizes[name] = sum(bind_dim(p, sizes) for p in parts)
        return sizes[name]
    sizes[name] = _DEFAULT_DIM + len([k for k in sizes if "+" not in k and k != name]) % 3
    return sizes[name]


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int | None:
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            table = inits.get(node.input[0])
            if table is not None and table.dims:
                return int(table.dims[0])
    return None


def long_dims(model: onnx.ModelProto, times: int) -> dict[str, int]:
    """Sizes for ``make_feeds`` with every symbolic dim past an input's leading (batch) axis ``times`` as long:
    a speech front end's strided convolutions turn 5 samples into none, so such a model runs only on longer
    inputs (wav2vec2 needs 400)."""
    sizes: dict[str, int] = {}
    for inp in model.graph.input:
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            name = d.dim_param or f"unk_{inp.name}_{i}"
            if not d.HasField("dim_value") and i > 0 and name not in sizes:
                sizes[name] = bind_dim(name, dict(sizes)) * times
    return sizes


def make_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {**_unnamed_batches(model), **(dims or {})}
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
            data = _padding(shape).astype(bool)
        elif "mask" in name:
            data = _padding(shape).astype(dtype)
        elif "position" in name and shape:
            data = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        else:
            high = _vocab_size(model, inp.name) or 2
            data = rng.integers(0, high, size=shape).astype(dtype)
        feeds[inp.name] = data
    return feeds


def _unnamed_batches(model: onnx.ModelProto) -> dict[str, int]:
    """The leading axis of every input whose exporter named it with an invented symbol (tf2onnx: ``unk__62`` for
    the tokens, ``unk__63`` for their mask) is the batch, one size for all: drawn apart, the mask's batch would
    broadcast against a batch of 1 elsewhere, a call no user makes and no fused op takes."""
    leading = [
        inp.type.tensor_type.shape.dim[0].dim_param
        for inp in model.graph.input
        if inp.type.tensor_type.shape.dim and inp.type.tensor_type.shape.dim[0].dim_param.startswith("unk__")
    ]
    return dict.fromkeys(leading, _DIM_SIZES["batch"]) if len(set(leading)) > 1 else {}


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
    −inf row is still caught; :func:`egfuse.validate.compare`), and the masks are judged on float32 copies
    of both models (:mod:`egfuse.judge`); the base feeds judge the half-precision rounding."""
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


def input_dims(model: onnx.ModelProto) -> list[str]:
    """The symbolic dims of the graph inputs, in order of first use."""
    names: list[str] = []
    for inp in model.graph.input:
        for d in inp.type.tensor_type.shape.dim:
            name = d.dim_param
            if name and not name.strip().isdigit() and name not in names:
                names.append(name)
    return names


def related_bindings(model: onnx.ModelProto, limit: int = 40) -> list[dict[str, int]]:
    """Candidate bindings for a graph whose inputs' dims are related in ways their names do not say: the
    dynamo exporter names a KV-cache model's mask length with a symbol of its own (``s53``) that must equal
    past + new length; a traced decoder step may only run on one new token. Independent sizes then make the
    original itself fail. Each candidate rebinds one symbolic dim — to 1, to the sum of two other input sizes
    (symbolic or fixed), or to another size — the rest bound by name as ``make_feeds`` does (a "total" length
    follows its parts); the caller keeps the first binding the original runs on, so a wrong guess costs one
    run and can never pass a wrong fusion. Inputs alike in shape (a cache's tensors) bound to equal sizes come
    first, then each single rebinding alone and on top of those."""
    symbols = input_dims(model)
    base: dict[str, int] = {}
    for name in symbols:
        bind_dim(name, base)
    dims = [d for inp in model.graph.input for d in inp.type.tensor_type.shape.dim]
    fixed = {d.dim_value for d in dims if d.HasField("dim_value")}
    singles: list[dict[str, int]] = [{target: 1} for target in symbols if base[target] != 1]
    for target in reversed(symbols):  # the mask's length comes after the ids' and the cache's
        sizes = sorted({base[s] for s in symbols if s != target} | fixed)
        sums = sorted({a + b for i, a in enumerate(sizes) for b in sizes[i:]} - {base[target]})
        singles += [{target: total} for total in sums]
        singles += [{target: size} for size in sizes if size not in (1, base[target])]
    alike = _alike_inputs_binding(model, base)
    if not alike:
        return singles[:limit]
    return [alike, *({**alike, **single} for single in singles)][:limit]


def _alike_inputs_binding(model: onnx.ModelProto, base: dict[str, int]) -> dict[str, int]:
    """Inputs alike in rank and fixed dims (a cache's keys and values, layer after layer) with one size at each
    symbolic axis: torch's dynamo exporter names every cache tensor's length apart (``s13``, ``s9``, ``s17``)
    although attention multiplies the keys' and values' lengths together."""
    groups: dict[tuple, list[str]] = {}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        pattern = tuple(d.dim_value if d.HasField("dim_value") else "?" for d in dims)
        for axis, d in enumerate(dims):
            if d.dim_param and "+" not in d.dim_param and not d.dim_param.strip().isdigit():
                groups.setdefault((pattern, axis), []).append(d.dim_param)
    binding: dict[str, int] = {}
    for names in groups.values():
        if len(set(names)) > 1:  # every member pinned: a size left to ``bind_dim`` depends on what is bound
            size = binding.get(names[0], base[names[0]])
            binding.update({name: size for name in names if name not in binding})
    return binding


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
