"""When raising a model's opset is only a renumbering: known from the op schemas, without onnx's converter.

onnx's version converter walks the opsets one by one and, for every op whose schema changed at that step, runs
the adapter registered for it. Most steps only widen the element types an op accepts; their adapter
(``CompatibleAdapter`` in onnx's ``version_converter/convert.h``) leaves the node as it is. A model whose every op
is either unchanged between its opset and the target, or changed only by such steps, comes out of the converter
node for node as it went in: the opset import renumbered, nothing else. Running the converter to learn that cost
a 48-layer BERT 55 ms (it copies the model into C++ and back); the schemas say it in under a millisecond.

Anything else — an op with a real adapter (Softmax's axis at 13, Split's ``num_outputs`` at 18, the Reduce ops'
axes input), an op of another domain, local functions, a step this table does not name — goes through the
converter as before, so the prediction can only be too cautious, never wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

__all__ = ["only_renumbered"]

_SAME_NODE_STEPS: dict[int, frozenset[str]] = {
    version: frozenset(ops.split())
    for version, ops in {
        13: "Abs Add ArgMax ArgMin Cast Ceil Clip Concat Constant DepthToSpace DequantizeLinear Div Dropout Equal "
        "Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gemm Greater Hardmax Identity If IsNaN LRN "
        "Less Log Loop MatMul Max Mean MeanVarianceNormalization Min Mod Mul Neg NegativeLogLikelihoodLoss "
        "NonZero Pad Pow QuantizeLinear Reciprocal ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSumSquare Relu Reshape Resize ScatterElements ScatterND Shape Sigmoid Sign Size Slice "
        "SoftmaxCrossEntropyLoss SpaceToDepth Sqrt Sub Sum Tanh Tile Transpose",
        14: "Add CumSum Div Identity Mul Relu Reshape Sub",
        15: "BatchNormalization Pow Shape",
        16: "GreaterOrEqual Identity If LeakyRelu LessOrEqual Loop PRelu Scan ScatterElements ScatterND Where",
        18: "OptionalGetElement OptionalHasElement Pad Resize ScatterElements ScatterND",
        19: "AveragePool Cast CastLike Constant DequantizeLinear Equal Identity If Loop Pad QuantizeLinear Reshape "
        "Resize Scan Shape Size",
        20: "ConstantOfShape IsInf IsNaN ReduceMax ReduceMin",
        21: "Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten GroupNormalization Identity If Loop "
        "Pad QLinearMatMul QuantizeLinear Reshape Scan Shape Size Squeeze Transpose Unsqueeze",
        22: "Acos Acosh Asin Asinh Atan Atanh AveragePool Bernoulli Conv ConvTranspose Cos Cosh DeformConv Det "
        "Dropout Elu EyeLike GRU GlobalAveragePool GlobalLpPool GlobalMaxPool GridSample HardSigmoid HardSwish "
        "InstanceNormalization LSTM LpNormalization LpPool MaxPool MaxRoiPool MaxUnpool Mish Multinomial "
        "NegativeLogLikelihoodLoss RNN RandomNormal RandomNormalLike RandomUniform RandomUniformLike RoiAlign "
        "Round Selu Sin Sinh Softplus Softsign Tan ThresholdedRelu",
        23: "Cast CastLike Constant ConstantOfShape DequantizeLinear Flatten Identity If Loop Pad QuantizeLinear "
        "Reshape Scan Shape Size Squeeze Transpose Unsqueeze",
    }.items()
}
"""Opset version → the ops whose schema changed at that version with onnx's converter leaving the node as it
was (its ``CompatibleAdapter`` registrations from the version before): the new version only added element types
or relaxed a constraint."""

_DEFAULT_DOMAINS = ("", "ai.onnx")


def only_renumbered(model: onnx.ModelProto, old: int, new: int) -> bool:
    """Whether onnx's converter would take ``model`` from opset ``old`` to ``new`` changing no node: every op, in
    the graph and in its subgraphs, of the default domain and unchanged between the two opsets but for steps
    that keep the node. A model with local functions is left to the converter (each is converted alone)."""
    if model.functions or not 0 < old <= new:
        return False
    return all(_same_node(op, old, new) for op in _op_types(model.graph.node))


def _op_types(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """The op types of ``nodes`` and of their subgraphs; ``"?"`` marks a node of another domain."""
    found: set[str] = set()
    stack = [nodes]
    while stack:
        for node in stack.pop():
            found.add(node.op_type if node.domain in _DEFAULT_DOMAINS else "?")
            for attribute in node.attribute:
                graphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
                stack.extend(graph.node for graph in graphs)
    return found


def _same_node(op: str, old: int, new: int) -> bool:
    """Every version of ``op`` after ``old`` up to ``new`` is a step that keeps the node."""
    version = new
    while True:
        try:
            since = onnx.defs.get_schema(op, version, "").since_version
        except onnx.defs.SchemaError:  # no such op (or another domain's): the converter decides
            return False
        if since <= old:
            return True
        if op not in _SAME_NODE_STEPS.get(since, ()):
            return False
        version = since - 1
