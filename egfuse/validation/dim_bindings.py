"""Sizes for a graph's symbolic dims when validation makes its inputs: bound by name to small distinct sizes
(a batch of 2, a "total" length the sum of its parts), longer where a front end needs it, or rebound in the
relations a graph needs but its names do not say (a cache's mask length equal to past + new).

Apart from the feeds themselves (:mod:`egfuse.validation.inputs`): which sizes to try is a question of the graph's names
and of what the original runs on, not of what the data holds.
"""

from __future__ import annotations

import re

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


def unnamed_batches(model: onnx.ModelProto) -> dict[str, int]:
    """The leading axis of every input whose exporter named it with an invented symbol (tf2onnx: ``unk__62`` for
    the tokens, ``unk__63`` for their mask) is the batch, one size for all: drawn apart, the mask's batch would
    broadcast against a batch of 1 elsewhere, a call no user makes and no fused op takes."""
    leading = [
        inp.type.tensor_type.shape.dim[0].dim_param
        for inp in model.graph.input
        if inp.type.tensor_type.shape.dim and inp.type.tensor_type.shape.dim[0].dim_param.startswith("unk__")
    ]
    return dict.fromkeys(leading, _DIM_SIZES["batch"]) if len(set(leading)) > 1 else {}


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
