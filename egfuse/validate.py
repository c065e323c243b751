"""Numerical proof on onnxruntime: the fused model against the original, on generated feeds.

Feeds are built so attention is exercised as in real use: symbolic dims bound to small distinct sizes,
integer masks with real padding (0s at the end of the last sequence and, left padding, at the start of
the first), token ids inside the embedding table. Region outputs keep their names through fusion, so one
run compares every region separately and a failing region can be rolled back alone.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from egfuse import protos

ATOL = 1e-4
RTOL = 1e-3
HALF_TOLERANCE = 1e-2
"""float16/bfloat16 outputs without a float32 reference: ~10 ulps of float16 (absolute and relative)."""
HALF_ULPS = 8
"""float16/bfloat16 outputs with a float32 reference: the fused op may be off it by twice the original's
own error plus this many ulps of the output's magnitude. It rounds its intermediates differently from the
unfused graph (the scale applied once instead of to Q and K, say), which costs a few ulps on its own."""

_PROVIDERS = ["CPUExecutionProvider"]
_DIM_SIZES = {"batch": 2}
_DEFAULT_DIM = 5


@dataclass
class Comparison:
    name: str
    max_abs_diff: float
    ok: bool


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
    sizes = dict(dims or {})
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
        if np.issubdtype(dtype, np.floating):
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


def mask_feed_sets(feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Further feeds, the base ``feeds`` with only their masks changed, so what a fused region does with a mask
    is exercised and not just present: many padded positions (row 0 padded on the left over half its keys, the
    last row on the right), random masks (each row keeping at least one key), and — for a float mask, whose
    convention a name does not tell — the same padding written additively (0 and finfo.min), which also masks
    every key of some query rows under a causal mask. Empty when the model takes no mask.

    A batch row whose keys are *all* padding is not drawn: there the graph's answer is decided by how its fill
    absorbs the scores in floating point (the mean of V for finfo.min in float32, the softmax of rounded scores
    in float16, something between for −1e30), which no kernel is bound to reproduce."""
    masks = {name: value for name, value in feeds.items() if _is_mask_input(name, value)}
    if not masks:
        return {}
    rng = np.random.default_rng(7)
    sets: dict[str, dict[str, np.ndarray]] = {"heavy padding": {}, "random masks": {}}
    additive: dict[str, np.ndarray] = {}
    for name, value in masks.items():
        heavy, random = _heavy_padding(value.shape), _random_mask(value.shape, rng)
        sets["heavy padding"][name] = heavy.astype(value.dtype)
        sets["random masks"][name] = random.astype(value.dtype)
        if np.issubdtype(value.dtype, np.floating):
            additive[name] = np.where(heavy > 0, 0.0, np.finfo(value.dtype).min).astype(value.dtype)
    if additive:
        sets["additive padding"] = additive
    return {label: {**feeds, **changed} for label, changed in sets.items()}


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


def session(model: onnx.ModelProto, weights: protos.DetachedWeights | None = None) -> ort.InferenceSession:
    """A plain CPU session. A model made from a large model's skeleton (``weights``) is loaded from a file
    beside its weights, which onnxruntime maps rather than copies; a large model given whole is written to
    such a file first."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors come back as exceptions, into the report: none printed
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if weights is None and not protos.is_large(model):
        return ort.InferenceSession(model.SerializeToString(), options, providers=_PROVIDERS)
    # Weight-sized temporaries (an LLM's transposed lm_head: 2 GB) are freed as soon as they are read rather
    # than kept by the arena: measured on onnxscript's phi4 model, 3 GB less at the peak.
    options.enable_cpu_mem_arena = False
    if weights is not None:
        return _session_from_file(weights.model_file(model), options)
    with tempfile.TemporaryDirectory(prefix="egfuse-validate-", ignore_cleanup_errors=True) as workdir:
        return _session_from_file(protos.save_with_external_data(model, Path(workdir) / "model.onnx"), options)


def _session_from_file(path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), options, providers=_PROVIDERS)
    finally:
        path.unlink()  # the session has read the graph; its weights stay mapped from the data file


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the named intermediate values."""
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    present = {o.name for o in extra.graph.output}
    for name in names:
        if name not in present:
            extra.graph.output.append(onnx.ValueInfoProto(name=name))
    return extra


def run(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    *,
    weights: protos.DetachedWeights | None = None,
) -> dict[str, np.ndarray]:
    probe = with_outputs(model, outputs) if outputs else model
    sess = session(probe, weights)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def original_outputs(
    original: onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None,
    names: list[str],
    *,
    weights: protos.DetachedWeights | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The feeds validation uses and the original's outputs on them. The user's feeds are used as they are
    (never another binding: the user said what the model runs on); generated feeds are tried with dims bound
    independently, then longer ones (:func:`long_dims`: a speech front end), then the related bindings
    (:func:`related_bindings`: a cache's lengths) — the first the original runs on is kept. Raises the first
    failure when none runs."""
    if feeds is not None:
        return feeds, run(original, feeds, names, weights=weights)
    data = make_feeds(original)
    try:
        return data, run(original, data, names, weights=weights)
    except Exception as first:
        for dims in [long_dims(original, 80), *related_bindings(original)]:
            data = make_feeds(original, dims=dims)
            try:
                return data, run(original, data, names, weights=weights)
            except Exception:  # the next binding is tried; the first error is the one reported
                continue
        raise first


HALF_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def upcast(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph computed in float32: every float16/bfloat16 tensor, type and cast target widened.

    The reference half-precision outputs are judged against: a fused op rounds differently from the
    primitive ops, so the question is not "are they equal" but "is the fused model no further from the
    exact result than the original is"."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.tensor_type.elem_type in HALF_TYPES:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT

    def widen(tensor: onnx.TensorProto) -> None:
        if tensor.data_type in HALF_TYPES:
            array = onnx.numpy_helper.to_array(tensor).astype(np.float32)
            tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))

    for tensor in graph.initializer:
        widen(tensor)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                widen(attr.t)
            elif attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i in HALF_TYPES:
                attr.i = onnx.TensorProto.FLOAT
    return wide


def _upcast_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}


def compare(
    name: str,
    expected: np.ndarray,
    actual: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    where_defined: bool = False,
) -> Comparison:
    """Float32 outputs must agree to ``ATOL + RTOL·|expected|``. Half-precision outputs with a float32
    ``reference`` must be no further from it than twice the original's own error plus ``HALF_ULPS`` ulps;
    without one, ``HALF_TOLERANCE`` applies. NaN must meet NaN — except, with ``where_defined``, where the
    original itself gives NaN (a query row whose keys a −inf mask hides entirely: the mask-exercising feeds
    make such rows, and the original defines nothing there)."""
    if where_defined and np.issubdtype(expected.dtype, np.floating) and expected.shape == actual.shape:
        undefined = np.isnan(expected)
        if undefined.any():
            actual = np.where(undefined, expected, actual)
            if reference is not None and reference.shape == expected.shape:
                reference = np.where(undefined, expected.astype(reference.dtype), reference)
    if expected.shape != actual.shape:
        return Comparison(name, float("inf"), False)
    if not np.issubdtype(expected.dtype, np.floating):
        same = bool(np.array_equal(expected, actual))
        return Comparison(name, 0.0 if same else float("inf"), same)
    worst, diff = _max_diff(expected, actual)
    half = np.finfo(expected.dtype).bits <= 16
    if half and reference is not None and reference.shape == expected.shape:
        own, _ = _max_diff(reference, expected)
        ours, _ = _max_diff(reference, actual)
        ulp = float(np.finfo(expected.dtype).eps) * max(1.0, float(np.nanmax(np.abs(reference), initial=0.0)))
        return Comparison(name, worst, ours <= 2 * own + HALF_ULPS * ulp)
    atol, rtol = (HALF_TOLERANCE, HALF_TOLERANCE) if half else (ATOL, RTOL)
    ok = bool(np.all(diff <= atol + rtol * np.nan_to_num(np.abs(expected.astype(np.float64)), posinf=0.0)))
    return Comparison(name, worst, ok)


def _max_diff(expected: np.ndarray, actual: np.ndarray) -> tuple[float, np.ndarray]:
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where((np.isnan(e) & np.isnan(a)) | (e == a), 0.0, np.abs(e - a))  # the same inf is no diff
    diff = np.where(np.isnan(diff), np.inf, diff)
    return (float(diff.max()) if diff.size else 0.0), diff


def references(
    original: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    names: list[str],
    *,
    weights: protos.DetachedWeights | None = None,
) -> dict[str, np.ndarray]:
    """Float32 references for the half-precision outputs among ``expected`` (empty when there are none, when
    the widened model does not run, or for a large model, whose weights a widened copy would double: then the
    fixed half tolerance applies)."""
    if weights is not None:
        return {}
    if not any(np.issubdtype(v.dtype, np.floating) and np.finfo(v.dtype).bits <= 16 for v in expected.values()):
        return {}
    try:
        return run(upcast(original), _upcast_feeds(feeds), names)
    except Exception:  # an op without a float32 kernel, say: fall back to the fixed tolerance
        return {}


def compare_models(
    original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str] | None = None
) -> dict[str, Comparison]:
    """Every graph output (and the named intermediate values) of both models, compared as above."""
    expected = run(original, feeds, names)
    actual = run(fused, feeds, names)
    reference = references(original, feeds, expected, names or [])
    return {n: compare(n, e, actual[n], reference.get(n)) for n, e in expected.items() if n in actual}
