"""RoPE in the spellings exporters write, for :func:`~egfuse.testing.model.attention_model`."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from egfuse.testing.blocks import Builder
from egfuse.testing.variant import Variant


class Rope:
    """Rotary embedding ``x·cos + rotate(x)·sin`` on the first ``width`` features of each head: rotate-half
    (Llama) or interleaved pairs (GPT-J), on (B, N, S, H) or (B, S, N, H), with (B, S, ·) cos/sin tables that
    are graph inputs or computed from positions."""

    def __init__(self, b: Builder, v: Variant, inputs: list, batch, seq, onnx_type: int) -> None:
        self.b, self.head, self.interleaved = b, v.head_dim, v.rope_interleaved
        self.width = v.head_dim // 2 if v.rope_partial else v.head_dim
        self.half = self.width // 2
        table_width = self.half if self.interleaved else self.width
        if v.rope_tables == "inputs":
            for name in ("cos", "sin"):
                inputs.append(helper.make_tensor_value_info(name, onnx_type, [batch, seq, table_width]))
            tables = ["cos", "sin"]
        elif v.rope_tables == "buffer":  # (max_positions, width) tables cut to [:S], broadcast over the batch
            length = b.op("Shape", ["x"], start=1, end=2)
            angles = np.arange(64, dtype=np.float32)[:, None] * (
                1.0 / 10000 ** (np.arange(0, self.width, 2) / self.width)
            )
            if not self.interleaved:
                angles = np.concatenate([angles, angles], axis=-1)
            np_type = helper.tensor_dtype_to_np_dtype(onnx_type)
            tables = []
            for fn in (np.cos, np.sin):
                zero, first = b.const(np.array([0], np.int64)), b.const(np.array([0], np.int64))
                cut = b.op("Slice", [b.const(fn(angles).astype(np_type), "table"), zero, length, first])
                tables.append(b.op("Unsqueeze", [cut, b.const(np.array([0], np.int64))]))
        else:  # transformers: θ = position ⊗ inv_freq; cos/sin of θ (GPT-J) or of Concat(θ, θ), in the model's type
            length = b.op("Squeeze", [b.op("Shape", ["x"], start=1, end=2)])
            positions = b.op(
                "Cast",
                [b.op("Range", [b.const(np.array(0, np.int64)), length, b.const(np.array(1, np.int64))])],
                to=TensorProto.FLOAT,
            )
            inv_freq = (1.0 / 10000 ** (np.arange(0, self.width, 2) / self.width)).astype(np.float32)
            theta = b.op(
                "Mul", [b.op("Unsqueeze", [positions, b.const(np.array([0, 2], np.int64))]), b.const(inv_freq)]
            )
            angles = theta if self.interleaved else b.op("Concat", [theta, theta], axis=-1)
            tables = [b.op("Cast", [b.op(op, [angles])], to=onnx_type) for op in ("Cos", "Sin")]
        axis = 2 if v.rope_seq_first else 1
        self.cos, self.sin = (self._spread(t, axis) for t in tables)

    def _spread(self, table: str, axis: int) -> str:
        """The table unsqueezed at the head axis (and repeat_interleave'd by 2 when the features are paired)."""
        b = self.b
        if not self.interleaved:
            return b.op("Unsqueeze", [table, b.const(np.array([axis], np.int64))])
        wide = b.op("Unsqueeze", [table, b.const(np.array([axis, 4], np.int64))])
        pairs = b.op("Expand", [wide, b.const(np.array([1, 1, 1, 1, 2], np.int64))])
        return b.op("Reshape", [pairs, b.const(np.array([0, 0, 0, -1], np.int64))])

    def __call__(self, t: str) -> str:
        b = self.b

        def part(x: str, start: int, stop: int, step: int = 1) -> str:
            ends = [b.const(np.array([e], np.int64)) for e in (start, stop, -1, step)]
            return b.op("Slice", [x, *ends])

        x = part(t, 0, self.width) if self.width < self.head else t
        if self.interleaved:  # rotate_every_two: stack (−x[1::2], x[0::2]) on a new axis, flatten
            last = b.const(np.array([-1], np.int64))
            pair = [b.op("Unsqueeze", [y, last]) for y in (b.op("Neg", [part(x, 1, 2**31, 2)]), part(x, 0, 2**31, 2))]
            stacked = b.concat(pair, axis=-1)
            rotated = b.op("Reshape", [stacked, b.const(np.array([0, 0, 0, -1], np.int64))])
        else:
            rotated = b.concat([b.op("Neg", [part(x, self.half, 2**31)]), part(x, 0, self.half)], axis=-1)
        out = b.op("Add", [b.op("Mul", [x, self.cos]), b.op("Mul", [rotated, self.sin])])
        return b.op("Concat", [out, part(t, self.width, 2**31)], axis=-1) if self.width < self.head else out
