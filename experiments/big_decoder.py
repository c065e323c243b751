"""A Llama-shaped float16 decoder of any size written straight to disk: random weights go to an external-data
file tensor by tensor, so a 7B-shaped model (13.5 GB) is built on a machine that could not hold it twice.

The graph is spelled as transformers' eager Llama writes it in float16 (without RoPE, which does not change
what memory holds): an embedding Gather, per layer an RMSNorm computed in float32 (``Cast → x·rsqrt(mean x² +
ε) → Cast``) with its weight, Q/K/V projections split into heads, ``softmax(Q·Kᵀ·(1/√d) + causal)·V``
with a causal mask ``Trilu(ConstantOfShape(−inf))``, the output projection and residual, a SwiGLU MLP, and a
final norm and LM head. Weights are drawn once into a pool and written as slices of it at different offsets
(a file as large as the model, written at disk speed); their scale keeps float16 activations finite through
every layer. Offsets are aligned to 64 KiB, so onnxruntime maps the file rather than copying it.

    python experiments/big_decoder.py OUT.onnx                       # 7B-shaped: 32 layers, hidden 4096
    python experiments/big_decoder.py OUT.onnx --layers 2 --hidden 64 --heads 4 --ffn 172 --vocab 99
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGNMENT = 1 << 16
POOL_ELEMENTS = 1 << 27  # 256 MB of float16 values, sliced for every tensor


class _Writer:
    """Initializers whose bytes are appended to one data file beside the model."""

    def __init__(self, data_path: Path, rng: np.random.Generator) -> None:
        self.file = open(data_path, "wb")  # noqa: SIM115 - closed by close()
        self.location = data_path.name
        self.pool = rng.standard_normal(POOL_ELEMENTS, dtype=np.float32).astype(np.float16)
        self.initializers: list[TensorProto] = []
        self._cursor = 0

    def weight(self, name: str, dims: tuple[int, ...], scale: float) -> str:
        size = math.prod(dims)
        start = self._cursor % max(1, POOL_ELEMENTS - size) if size < POOL_ELEMENTS else 0
        self._cursor += 7919  # a different slice for every tensor
        data = self.pool[start : start + size] if size <= POOL_ELEMENTS else np.resize(self.pool, size)
        payload = (data * np.float16(scale)).astype(np.float16).tobytes()
        offset = math.ceil(self.file.tell() / ALIGNMENT) * ALIGNMENT
        self.file.seek(offset)
        self.file.write(payload)
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=list(dims))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(len(payload)))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def ones(self, name: str, width: int) -> str:
        self.initializers.append(onnx.numpy_helper.from_array(np.ones(width, np.float16), name))
        return name

    def close(self) -> None:
        self.file.close()


def build(path: Path, layers: int = 32, hidden: int = 4096, heads: int = 32, ffn: int = 11008, vocab: int = 32000):
    """Write the decoder to ``path`` and its weights to ``path.data``; returns the weights' bytes."""
    rng = np.random.default_rng(0)
    w = _Writer(path.with_name(path.name + ".data"), rng)
    nodes: list[onnx.NodeProto] = []
    count = [0]

    def node(op: str, inputs: list[str], **attrs) -> str:
        count[0] += 1
        out = f"{op.lower()}_{count[0]}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(array: np.ndarray) -> str:
        return node("Constant", [], value=onnx.numpy_helper.from_array(array))

    head_dim = hidden // heads
    eps, f32, f16 = const(np.array(1e-6, np.float32)), TensorProto.FLOAT, TensorProto.FLOAT16
    last_axis = const(np.array([-1], np.int64))

    def rms(x: str, weight: str) -> str:
        xf = node("Cast", [x], to=f32)
        var = node("ReduceMean", [node("Mul", [xf, xf]), last_axis], keepdims=1)
        inv = node("Reciprocal", [node("Sqrt", [node("Add", [var, eps])])])
        return node("Mul", [weight, node("Cast", [node("Mul", [xf, inv])], to=f16)])

    def heads_of(x: str, perm: list[int]) -> str:
        split = node("Reshape", [x, const(np.array([0, 0, heads, head_dim], np.int64))])
        return node("Transpose", [split], perm=perm)

    seq = node("Shape", ["input_ids"], start=1, end=2)
    square = node("ConstantOfShape", [node("Concat", [seq, seq], axis=0)],
                  value=helper.make_tensor("", f16, [1], [float("-inf")]))  # fmt: skip
    causal = node("Trilu", [square, const(np.array(1, np.int64))], upper=1)
    scale = const(np.array(1 / math.sqrt(head_dim), np.float16))
    x = node("Gather", [w.weight("embed", (vocab, hidden), 1.0), "input_ids"])
    for i in range(layers):
        h = rms(x, w.ones(f"l{i}.in_norm", hidden))
        std = 1 / math.sqrt(hidden)
        q = heads_of(node("MatMul", [h, w.weight(f"l{i}.wq", (hidden, hidden), std)]), [0, 2, 1, 3])
        k = heads_of(node("MatMul", [h, w.weight(f"l{i}.wk", (hidden, hidden), std)]), [0, 2, 3, 1])
        v = heads_of(node("MatMul", [h, w.weight(f"l{i}.wv", (hidden, hidden), std)]), [0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [q, k]), scale]), causal])
        context = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        merged = node("Reshape", [node("Transpose", [context], perm=[0, 2, 1, 3]),
                                  const(np.array([0, 0, hidden], np.int64))])  # fmt: skip
        x = node("Add", [x, node("MatMul", [merged, w.weight(f"l{i}.wo", (hidden, hidden), std)])])
        h = rms(x, w.ones(f"l{i}.post_norm", hidden))
        gate = node("MatMul", [h, w.weight(f"l{i}.gate", (hidden, ffn), std)])
        up = node("MatMul", [h, w.weight(f"l{i}.up", (hidden, ffn), std)])
        act = node("Mul", [node("Mul", [gate, node("Sigmoid", [gate])]), up])
        x = node("Add", [x, node("MatMul", [act, w.weight(f"l{i}.down", (ffn, hidden), 1 / math.sqrt(ffn))])])
    logits = node("MatMul", [rms(x, w.ones("final_norm", hidden)), w.weight("lm_head", (hidden, vocab), std)])
    nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    w.close()
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", f16, ["batch", "sequence", vocab])],
        w.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    path.write_bytes(model.SerializeToString())
    return path.with_name(path.name + ".data").stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    for name, default in (("layers", 32), ("hidden", 4096), ("heads", 32), ("ffn", 11008), ("vocab", 32000)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args(argv)
    size = build(args.out, args.layers, args.hidden, args.heads, args.ffn, args.vocab)
    print(f"{args.out}: {size / (1 << 30):.2f} GB of weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
