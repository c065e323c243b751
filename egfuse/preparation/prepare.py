"""Prepare: the model as the search needs it — the opset raised where the target's ops need it, shapes inferred.

A target that writes the standard ``Attention`` (opset 23) gets the model converted by onnx's version converter
(or, where it refuses and validation will judge, a plain opset bump); ``ort`` converts only once a region chose
the standard op (:func:`admit_standard_attention`).
"""

from __future__ import annotations

import onnx

from egfuse.analysis.dims import integer_text_dims
from egfuse.errors import EgfuseError
from egfuse.files.load import LoadedModel, default_opset
from egfuse.preparation.renumbering import only_renumbered
from egfuse.preparation.shape_inference import infer_shapes, without_node_metadata
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, TargetSpec


def prepare(loaded: LoadedModel, target: TargetSpec, will_validate: bool) -> tuple[onnx.ModelProto, str | None]:
    """Raise the opset where the target needs it and infer shapes; returns the model and a note for the report."""
    proto, note = loaded.proto, None
    old = default_opset(proto)
    if target.requires_standard_opset and old < STANDARD_ATTENTION_OPSET:
        converted, reason = _to_standard_opset(proto)
        if converted is None and not will_validate:
            raise EgfuseError(
                f"cannot convert opset {old} to {STANDARD_ATTENTION_OPSET} for the standard Attention op "
                f"({reason}); enable validation to try a plain opset bump, or use --target ort",
                path=loaded.source,
            )
        if converted is None:
            converted = bump_opset(proto, STANDARD_ATTENTION_OPSET)
            converted.ir_version = max(converted.ir_version, 10)
            note = (
                f"onnx's version converter could not convert opset {old} → {STANDARD_ATTENTION_OPSET} ({reason}); "
                "the opset import was raised as is and the result checked on onnxruntime"
            )
        proto = converted
    return infer_shapes(integer_text_dims(proto)), note


def needs_standard_opset(prepared: onnx.ModelProto, fused: onnx.ModelProto) -> bool:
    """A target that may choose the standard ops (``ort``) chose one in a model below opset 23."""
    opset = default_opset(prepared)
    if opset >= STANDARD_ATTENTION_OPSET:
        return False
    standard = _STANDARD_OPS | ({"Gelu"} if opset < GELU_OPSET else set())
    return any(n.op_type in standard and n.domain in ("", "ai.onnx") for n in fused.graph.node)


SOFTMAX_LAST_AXIS_OPSET = 13
"""Below it Softmax flattens from its axis on; from it, the axis alone (the converter's adapter between them)."""
_STANDARD_OPS = frozenset({"Attention", "RotaryEmbedding", "RMSNormalization"})
"""The default-domain ops egfuse writes that need opset 23."""
GELU_OPSET = 20
"""The standard Gelu's: below it, a Gelu the ort target wrote raises the model to opset 23 with the rest."""


def admit_standard_attention(
    loaded: LoadedModel, prepared: onnx.ModelProto, target: TargetSpec
) -> tuple[onnx.ModelProto | None, TargetSpec, str]:
    """The model converted to opset 23, for ``ort`` to use the standard op where it runs fastest — or, where
    onnx's converter cannot convert it, None and a target that does without the standard op (grouped K/V
    heads are then repeated for MultiHeadAttention). Unlike the ``onnx`` target, ``ort`` has that fallback,
    so no unconverted opset bump is ever tried here."""
    old = default_opset(prepared)
    converted, reason = _to_standard_opset(loaded.proto)
    if converted is None:
        note = (
            f"onnx's version converter could not convert opset {old} → {STANDARD_ATTENTION_OPSET} ({reason}), "
            "so the standard Attention and RotaryEmbedding ops were not used (grouped K/V heads are repeated for "
            "MultiHeadAttention, RoPE stays as it was)"
        )
        return None, target.below_opset(old), note
    newer = sorted({op.op for op in target.ops if op.domain in ("", "ai.onnx") and op.opset > old})
    note = (
        f"opset {old} → {STANDARD_ATTENTION_OPSET} (onnx's version converter) for the standard ops target "
        f"{target.name} writes from a newer opset ({', '.join(newer)})"
    )
    return converted, target, note


def _to_standard_opset(proto: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str]:
    """onnx's version converter to opset 23 (IR version 10 at least), or None and why it refused. Where the
    converter only renumbered the opset of a model without local functions (every node as it was: the usual
    case, since most ops' newer versions only add element types), ``proto`` itself renumbered — what putting
    back the metadata the converter drops would rebuild, without the cost (0.1 s for a 48-layer BERT). Where the
    op schemas already say so (:mod:`~egfuse.preparation.renumbering`), the converter is not run at all."""
    if only_renumbered(proto, default_opset(proto), STANDARD_ATTENTION_OPSET):
        return _renumbered(proto), ""
    bare = without_node_metadata(proto)
    if default_opset(proto) < SOFTMAX_LAST_AXIS_OPSET:
        # The softmax family's adapter reads its input's rank: without shapes it cannot tell that axis 3 of a
        # rank-4 input is the last, and wraps the op in Flatten/Reshape, which hides the attention from the rules
        # (TorchScript's opset-11 exports had none fused on ort and onnx).
        bare = infer_shapes(bare)
    try:
        converted = onnx.version_converter.convert_version(bare, STANDARD_ATTENTION_OPSET)
    except Exception as err:  # the converter raises bare RuntimeErrors with C++ text: its last line says why
        text = str(err).strip()
        return None, text.splitlines()[-1][-160:] if text else type(err).__name__
    if not proto.functions and _equal_nodes(bare, converted):  # (functions are converted one by one below)
        return _renumbered(proto), ""
    converted.ir_version = max(converted.ir_version, 10)
    _restore_what_the_converter_drops(proto, converted)
    return converted, ""


def _renumbered(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` at the standard op's opset (IR version 10 at least), every node as it was."""
    converted = bump_opset(proto, STANDARD_ATTENTION_OPSET)
    converted.ir_version = max(converted.ir_version, 10)
    return converted


def _equal_nodes(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """The same nodes, field for field (protobuf's own comparison: milliseconds for thousands of nodes)."""
    return len(a.graph.node) == len(b.graph.node) and list(a.graph.node) == list(b.graph.node)


def _restore_what_the_converter_drops(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """onnx's version converter drops nodes' ``metadata_props`` (a source map, the exporter's stack) and the
    model-local functions; neither is the user's to lose. Metadata goes back on the node with the same outputs;
    each function is converted through a model of its own body (or kept as written where the converter
    refuses it: a function may import its own opset), with the imports of its domain."""
    metadata = {tuple(n.output): n.metadata_props for n in original.graph.node if n.metadata_props}
    for node in converted.graph.node:
        props = metadata.get(tuple(node.output))
        if props and not node.metadata_props:
            node.metadata_props.extend(props)
    if converted.functions or not original.functions:
        return
    for function in original.functions:
        converted.functions.append(_converted_function(function))
    imported = {entry.domain for entry in converted.opset_import}
    converted.opset_import.extend(e for e in original.opset_import if e.domain not in imported)


def functions_at_model_opset(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with each local function that imports an older default opset than the model converted to the
    model's (in place): a search that wrote the standard ops raised the model's opset, and a function kept as
    written would import another version of the same domain, which onnx's checker refuses (onnxruntime runs it)."""
    version = default_opset(proto)
    for function in proto.functions:
        if any(e.domain in ("", "ai.onnx") and e.version < version for e in function.opset_import):
            function.CopyFrom(_converted_function(function, version))
    return proto


def _converted_function(function: onnx.FunctionProto, version: int = STANDARD_ATTENTION_OPSET) -> onnx.FunctionProto:
    untyped = [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in (*function.input, *function.output)]
    body = onnx.helper.make_graph(
        list(function.node), function.name, untyped[: len(function.input)], untyped[len(function.input) :]
    )
    try:
        model = onnx.version_converter.convert_version(
            onnx.helper.make_model(body, opset_imports=list(function.opset_import)), version
        )
    except Exception:  # kept as written, importing the opset it was written for
        return function
    result = onnx.FunctionProto()
    result.CopyFrom(function)
    del result.node[:]
    result.node.extend(model.graph.node)
    for entry in result.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    return result


def same_nodes(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """The same computation node for node (the converter drops nodes' metadata, which is not computation)."""
    if _equal_nodes(a, b):  # a renumbered model: every field equal, metadata too
        return True

    def key(n: onnx.NodeProto) -> tuple:
        attrs = tuple(x.SerializeToString(deterministic=True) for x in n.attribute)
        return n.op_type, n.domain, tuple(n.input), tuple(n.output), attrs

    return len(a.graph.node) == len(b.graph.node) and all(
        key(x) == key(y) for x, y in zip(a.graph.node, b.graph.node, strict=True)
    )


def bump_opset(proto: onnx.ModelProto, version: int) -> onnx.ModelProto:
    bumped = onnx.ModelProto()
    bumped.CopyFrom(proto)
    for entry in bumped.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    return bumped
