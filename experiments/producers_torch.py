"""The torch producers corpus: attention as models written with torch's own modules spell it, through both exporters.

Many models in the wild are not transformers' or timm's but a researcher's own: ``nn.MultiheadAttention``,
``nn.TransformerEncoder``/``Decoder`` and ``F.scaled_dot_product_attention`` called directly. Their masks follow
torch's conventions, not transformers': a boolean ``key_padding_mask`` or ``attn_mask`` is True where a key is
*hidden* (transformers' True keeps one), an ``attn_mask`` may be a float to add, and ``is_causal`` may stand in
for a mask. Each model is built from torch alone with tiny random weights (width 32, 4 heads of 8, batch 2,
7 tokens; dropout 0):

- ``mha_self``: ``nn.MultiheadAttention(batch_first=True)`` over one sequence, a boolean key padding mask
  (True = padding; the second row's last two keys padded);
- ``mha_cross``: cross-attention to a memory of another width (``kdim``/``vdim`` 24: separate Q, K, V
  projections) and length (5), its own padding mask;
- ``mha_causal``: a float additive causal ``attn_mask`` (0 and −inf above the diagonal) and key padding mask;
- ``encoder_post`` / ``encoder_pre``: ``nn.TransformerEncoder`` of two post-norm ReLU layers / pre-norm GELU
  layers, ``src_key_padding_mask``;
- ``decoder``: ``nn.TransformerDecoder`` of two layers: causal self-attention (``generate_square_subsequent_mask``
  with ``tgt_is_causal``) and cross-attention to a padded memory;
- ``sdpa_gqa``: a module of one's own calling ``F.scaled_dot_product_attention`` with ``is_causal=True``, a
  scale of its own and ``enable_gqa=True`` (8 query heads over 2 K/V heads).

The ``nn.MultiheadAttention`` models are exported twice: ``_fused`` with ``need_weights=False`` (torch computes
it with ``scaled_dot_product_attention``) and ``_eager`` with ``need_weights=True`` (the weights computed
explicitly: ``baddbmm``/``bmm``, softmax, ``bmm``); the encoder and decoder layers ask for no weights (``_fused``
only). The exporters, the check against torch on onnxruntime, the forked runner and the manifest are
``producers_timm.py``'s; ``blocks`` counts the attention modules run (forward hooks on ``MultiheadAttention`` and
the ``Attention`` classes here). The dynamo exports' node metadata (Python stacks with this machine's paths) is
dropped, as for diffusers. ``nn.TransformerEncoderLayer`` takes its native fast path
(``aten::_transformer_encoder_layer_fwd``, which neither exporter can export) when run without gradients: the
exports are traced with gradients on, as a user who met that error would.

Environment: egfuse's own venv with the ``corpus`` extra (torch 2.13)::

    python experiments/producers_torch.py                  # every model
    python experiments/producers_torch.py --only decoder   # re-export some
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import producers_timm  # experiments/ is not a package
from producers_diffusers import _drop_node_metadata
from producers_timm import BATCH, Spec

PRODUCER = "torch"
PACKAGES = ("torch", "onnx", "onnxruntime", "onnxscript", "numpy")
WIDTH, HEADS, TOKENS, MEMORY, MEMORY_WIDTH = 32, 4, 7, 5, 24


def _tokens() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    padding = np.zeros((BATCH, TOKENS), bool)
    padding[1, -2:] = True  # torch's convention: True hides the key
    return {"x": rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32), "key_padding_mask": padding}


def _additive_tokens() -> dict[str, np.ndarray]:
    """The padding as a float to add (0 kept, −inf hidden): what an additive causal ``attn_mask`` pairs with."""
    feeds = _tokens()
    feeds["key_padding_mask"] = np.where(feeds["key_padding_mask"], -np.inf, 0.0).astype(np.float32)
    return feeds


def _with_memory() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    padding = np.zeros((BATCH, MEMORY), bool)
    padding[0, -1:] = True
    return {"x": rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32),
            "memory": rng.standard_normal((BATCH, MEMORY, MEMORY_WIDTH)).astype(np.float32),
            "memory_key_padding_mask": padding}  # fmt: skip


def _decoder_feeds() -> dict[str, np.ndarray]:
    feeds = _with_memory()
    feeds["memory"] = np.random.default_rng(2).standard_normal((BATCH, MEMORY, WIDTH)).astype(np.float32)
    return feeds


def _mha(kind: str) -> Callable[[str], Any]:
    """``nn.MultiheadAttention`` used directly; ``impl`` 'eager' asks it for the attention weights."""

    def make(impl: str):
        import torch

        need_weights = impl == "eager"
        cross = kind == "cross"
        extra = {"kdim": MEMORY_WIDTH, "vdim": MEMORY_WIDTH} if cross else {}

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.attention = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True, **extra)
                self.out = torch.nn.Linear(WIDTH, WIDTH)

            def forward(self, x, memory_or_padding, padding=None):
                if cross:
                    memory = memory_or_padding
                    y, _ = self.attention(x, memory, memory, key_padding_mask=padding, need_weights=need_weights)
                    return self.out(y)
                mask = None
                if kind == "causal":
                    mask = torch.triu(torch.full((x.shape[1], x.shape[1]), float("-inf")), diagonal=1)
                y, _ = self.attention(x, x, x, key_padding_mask=memory_or_padding, attn_mask=mask,
                                      need_weights=need_weights)  # fmt: skip
                return self.out(y)

        return Model()

    return make


def _encoder(norm_first: bool, activation: str) -> Callable[[], Any]:
    def make():
        import torch

        layer = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, activation=activation,
                                                 batch_first=True, norm_first=norm_first)  # fmt: skip

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

            def forward(self, x, padding):
                return self.encoder(x, src_key_padding_mask=padding)

        return Model()

    return make


def _decoder():
    import torch

    layer = torch.nn.TransformerDecoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, batch_first=True)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = torch.nn.TransformerDecoder(layer, 2)

        def forward(self, x, memory, memory_padding):
            causal = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            return self.decoder(x, memory, tgt_mask=causal, tgt_is_causal=True,
                                memory_key_padding_mask=memory_padding)  # fmt: skip

    return Model()


def _sdpa_gqa():
    """A causal self-attention of one's own: 8 query heads of 4 over 2 K/V heads, ``enable_gqa``, scale 0.3."""
    import torch
    import torch.nn.functional as F

    q_heads, kv_heads, head_dim = 8, 2, 4

    class GroupedAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = torch.nn.Linear(WIDTH, q_heads * head_dim)
            self.kv = torch.nn.Linear(WIDTH, 2 * kv_heads * head_dim)
            self.out = torch.nn.Linear(q_heads * head_dim, WIDTH)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q(x).view(b, s, q_heads, head_dim).transpose(1, 2)
            k, v = self.kv(x).view(b, s, 2, kv_heads, head_dim).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
            return self.out(y.transpose(1, 2).reshape(b, s, q_heads * head_dim))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([GroupedAttention() for _ in range(2)])

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x)
            return x

    return Model()


def _sequence() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)}


def _attention_modules(model) -> list:
    return [m for m in model.modules() if type(m).__name__ in ("MultiheadAttention", "GroupedAttention")]


def _spec(name: str, make: Callable[[], Any], feeds: Callable[[], dict[str, np.ndarray]], flavour: list[str],
          heads: int = HEADS, head_dim: int = WIDTH // HEADS) -> Spec:  # fmt: skip
    return Spec(name, make, feeds, flavour, heads, head_dim, producer=PRODUCER, impls=("",),
                modules=_attention_modules, outputs=("y",), rewrite=_drop_node_metadata)  # fmt: skip


def _both(name: str, make: Callable[[str], Any], feeds, flavour: list[str]) -> list[Spec]:
    """``name_fused`` (no weights asked: torch's scaled_dot_product_attention) and ``name_eager`` (weights asked)."""
    return [_spec(f"{name}_{impl}", lambda impl=impl: make(impl), feeds, flavour) for impl in ("fused", "eager")]


TORCH = ["mha", "torch masks"]
SPECS: list[Spec] = [
    *_both("mha_self", _mha("self"), _tokens, [*TORCH, "padding mask"]),
    *_both("mha_cross", _mha("cross"), _with_memory, [*TORCH, "cross attention", "kdim/vdim"]),
    *_both("mha_causal", _mha("causal"), _additive_tokens, [*TORCH, "additive causal mask", "additive padding"]),
    _spec("encoder_post", _encoder(False, "relu"), _tokens, [*TORCH, "padding mask", "post-norm"]),
    _spec("encoder_pre", _encoder(True, "gelu"), _tokens, [*TORCH, "padding mask", "pre-norm", "gelu"]),
    _spec("decoder", _decoder, _decoder_feeds, [*TORCH, "causal", "cross attention", "padding mask"]),
    _spec("sdpa_gqa", _sdpa_gqa, _sequence, ["gqa", "causal", "is_causal", "custom scale"], heads=8,
          head_dim=4),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return producers_timm.producer_main(argv, __doc__, PRODUCER, SPECS, PACKAGES)


if __name__ == "__main__":
    sys.exit(main())
