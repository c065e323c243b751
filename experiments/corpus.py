"""Export tiny random Hugging Face models to ONNX: the corpus egfuse is measured on.

Models are built from configs (random weights, tiny sizes: nothing is downloaded) and exported with both
``torch.onnx.export(dynamo=False)`` (TorchScript, opset 17) and ``dynamo=True`` (opset 18). A manifest records
per model what a perfect fuser would fuse and the feeds to check it with; a failed export is a row with its
reason, never silently dropped.

    python experiments/corpus.py --out experiments/corpus            # the full corpus
    python experiments/corpus.py --out tests/data --set tests         # the small models the tests use
    python experiments/corpus.py --out tests/data/half --set half     # tests/exports/test_half_exports.py
    python experiments/corpus.py --out tests/data/held_out --set held_out   # tests/exports/test_held_out.py
    python experiments/corpus.py --out tests/data/old_opsets --set old_opsets   # tests/exports/test_old_opsets.py
    python experiments/corpus.py --out experiments/corpus/half --set half_all  # every architecture in fp16, bf16

Needs the ``corpus`` extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HIDDEN, HEADS, LAYERS, VOCAB, INTER = 32, 4, 2, 99, 64


@dataclass
class Spec:
    name: str
    build: Callable[[], tuple[object, dict[str, np.ndarray], list[str]]]  # model, example feeds, output names
    blocks: int  # attention blocks a perfect fuser fuses
    flavour: list[str]
    heads: int = HEADS
    kv_heads: int = HEADS
    head_dim: int = HIDDEN // HEADS
    exporters: tuple[str, ...] = ("torchscript", "dynamo")


@dataclass
class Entry:
    name: str
    exporter: str
    file: str | None
    blocks: int
    flavour: list[str]
    heads: int
    kv_heads: int
    head_dim: int
    inputs: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    export_seconds: float = 0.0


SEQ2SEQ_SIZES = {  # BART and Whisper: encoder and decoder the same tiny size
    "vocab_size": VOCAB, "d_model": HIDDEN, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
    "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS, "encoder_ffn_dim": INTER,
    "decoder_ffn_dim": INTER,
}  # fmt: skip
WHISPER_SIZES = {  # 8 mel bins × 32 frames; token ids inside the tiny vocabulary
    "num_mel_bins": 8, "max_source_positions": 16, "max_target_positions": 16, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
}  # fmt: skip


def _ids(batch: int = 2, seq: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, -2:] = 0  # padding in the last sequence
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}


def _wrap(model, input_names: list[str], output: str = "last_hidden_state"):
    import torch

    class Wrapper(torch.nn.Module):
        """transformers 5 wants keyword arguments; export passes positional ones."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(input_names, args, strict=True)))
            return getattr(out, output)

    return Wrapper().eval()


def _seq2seq_ids() -> dict[str, np.ndarray]:
    feeds = _ids()
    feeds["decoder_input_ids"] = np.random.default_rng(1).integers(0, VOCAB, (2, 5)).astype(np.int64)
    return feeds


def _hf(
    config: str,
    model: str,
    feeds: Callable[[], dict[str, np.ndarray]],
    sizes: dict,
    part: Callable | None = None,
    **model_kwargs,
) -> Callable[[str], Callable]:
    """A builder for ``transformers.<model>(<config>(**sizes))`` with the given attention implementation."""

    def with_attention(impl: str):
        def build():
            import transformers

            cfg = getattr(transformers, config)(**sizes, attn_implementation=impl)
            net = getattr(transformers, model)(cfg, **model_kwargs)
            if part is not None:
                net = part(net)
            inputs = feeds()
            return _wrap(net, list(inputs)), inputs, ["last_hidden_state"]

        return build

    return with_attention


def _pixels() -> dict[str, np.ndarray]:
    return {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)}


def _audio() -> dict[str, np.ndarray]:
    return {"input_features": np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)}


def _audio_and_ids() -> dict[str, np.ndarray]:
    return {**_audio(), "decoder_input_ids": np.random.default_rng(0).integers(0, VOCAB, (2, 5)).astype(np.int64)}


def _encoder(net):
    return net.get_encoder()


NO_CACHE = {"use_cache": False}
_bert = _hf(
    "BertConfig",
    "BertModel",
    _ids,
    {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTER,
        "max_position_embeddings": 64,
    },
)
_bart_encoder = _hf("BartConfig", "BartModel", _ids, {**SEQ2SEQ_SIZES, "max_position_embeddings": 64}, _encoder)
_bart = _hf("BartConfig", "BartModel", _seq2seq_ids, {**SEQ2SEQ_SIZES, "max_position_embeddings": 64, **NO_CACHE})
_vit = _hf(
    "ViTConfig",
    "ViTModel",
    _pixels,
    {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTER,
        "image_size": 16,
        "patch_size": 4,
        "num_channels": 3,
    },
    add_pooling_layer=False,
)
_whisper_encoder = _hf("WhisperConfig", "WhisperModel", _audio, {**SEQ2SEQ_SIZES, **WHISPER_SIZES}, _encoder)
_whisper = _hf("WhisperConfig", "WhisperModel", _audio_and_ids, {**SEQ2SEQ_SIZES, **WHISPER_SIZES, **NO_CACHE})
GPT2_SIZES = {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 64}
LLAMA_SIZES = {  # Llama and Gemma 2: grouped K/V heads (two query heads per K/V head)
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": HEADS // 2, "max_position_embeddings": 64,
}  # fmt: skip
_gpt2 = _hf("GPT2Config", "GPT2Model", _ids, {**GPT2_SIZES, **NO_CACHE})
_llama = _hf("LlamaConfig", "LlamaModel", _ids, {**LLAMA_SIZES, **NO_CACHE})
_gpt_neox = _hf(  # parallel residual: two norms of one input (equal weights at random init, stored once)
    "GPTNeoXConfig", "GPTNeoXModel", _ids, {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "max_position_embeddings": 64, **NO_CACHE},
)  # fmt: skip
_mpt = _hf(  # ALiBi bias, one packed QKV projection split by Slices whose ends are computed from Shape
    "MptConfig",
    "MptModel",
    _ids,
    {
        "d_model": HIDDEN,
        "n_heads": HEADS,
        "n_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_seq_len": 64,
        "expansion_ratio": 2,
        **NO_CACHE,
    },
)
_glm = _hf(  # interleaved RoPE on half the head, its tables cos[..., :R/2].repeat_interleave(2) of a full table
    "GlmConfig", "GlmModel", _ids, {**LLAMA_SIZES, **NO_CACHE, "pad_token_id": None, "eos_token_id": None}
)
_bitnet = _hf(  # an RMS norm on the attention's output itself, before the output projection
    "BitNetConfig", "BitNetModel", _ids, {**LLAMA_SIZES, **NO_CACHE, "pad_token_id": None, "eos_token_id": None}
)
_roformer = _hf(  # interleaved rotary tables read from sinusoidal_pos[None, None, :, :]: two whole Slices
    "RoFormerConfig", "RoFormerModel", _ids, {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "intermediate_size": INTER, "max_position_embeddings": 64, "embedding_size": HIDDEN},
)  # fmt: skip
_longt5_encoder = _hf(  # local attention: the sequence cut into blocks, each reading three blocks' keys (5D Einsums)
    "LongT5Config", "LongT5EncoderModel", _ids, {"vocab_size": VOCAB, "d_model": HIDDEN, "d_kv": HIDDEN // HEADS,
    "d_ff": INTER, "num_layers": LAYERS, "num_heads": HEADS, "relative_attention_num_buckets": 8,
    "encoder_attention_type": "local", **NO_CACHE},
)  # fmt: skip
_GPT_OSS_SIZES = {"pad_token_id": None, "eos_token_id": None, "head_dim": HIDDEN // HEADS, "num_local_experts": 4,
                  "num_experts_per_tok": 2, "sliding_window": 4, "experts_implementation": "batched_mm"}  # fmt: skip
"""gpt-oss at tiny sizes: 4 experts, a window of 4 on every other layer; the experts as batched MatMuls (the
default, grouped_mm, has no ONNX function)."""
_gpt_oss = _hf(  # attention sinks (a logit per head beside the scores, its column cut off), x − max(x) before the
    # softmax, RoPE on x's halves apart, a sliding window on every other layer
    "GptOssConfig",
    "GptOssModel",
    _ids,
    {**LLAMA_SIZES, **NO_CACHE, **_GPT_OSS_SIZES},
)
_deepseek_v3 = _hf(  # multi-head latent attention: Q and K of 12 (8 + 4 rotated: x's even and odd features rotated
    # apart and joined as halves, then after the unrotated part), V of 8, low-rank projections; experts after layer 1
    "DeepseekV3Config", "DeepseekV3Model", _ids, {**LLAMA_SIZES, **NO_CACHE, "pad_token_id": None,
    "eos_token_id": None, "num_key_value_heads": HEADS, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 8, "moe_intermediate_size": 16, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1,
    "experts_implementation": "batched_mm"},
)  # fmt: skip
_gemma4 = _hf(  # RMS norms written x · (mean x² + ε)^(−½) · γ (torch.pow), each cast back with CastLike (type_as),
    # Q, K and V normalized (V's without γ), layer scalars; its per-layer embeddings at a tiny vocabulary (their
    # default, 262144 rows, made a 538 MB export)
    "Gemma4TextConfig", "Gemma4TextModel", _ids, {**LLAMA_SIZES, **NO_CACHE, "head_dim": HIDDEN // HEADS,
    "pad_token_id": None, "bos_token_id": None, "eos_token_id": None, "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 8},
)  # fmt: skip
_vitdet = _hf(  # windowed and global attention over (B·N, S, H), decomposed relative positions, a 5D output view
    "VitDetConfig",
    "VitDetModel",
    lambda: {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)},
    {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "mlp_ratio": 2,
        "image_size": 16,
        "pretrain_image_size": 16,
        "patch_size": 4,
        "num_channels": 3,
        "window_size": 2,
        "window_block_indices": [0],
        "use_relative_position_embeddings": True,
    },
)
_sam_vision = _hf(  # segment-anything's encoder: windows, decomposed relative positions as SDPA's mask, a 5D output
    "SamVisionConfig",
    "SamVisionModel",
    lambda: {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)},
    {
        "hidden_size": HIDDEN,
        "output_channels": 16,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "image_size": 32,
        "patch_size": 4,
        "mlp_dim": INTER,
        "window_size": 2,
        "global_attn_indexes": [1],
        "use_rel_pos": True,
    },
)
_gemma2 = _hf(  # soft-capped scores, sliding-window layers, GQA, RoPE
    "Gemma2Config",
    "Gemma2Model",
    _ids,
    {
        **LLAMA_SIZES,
        "head_dim": HIDDEN // HEADS,
        "sliding_window": 4,  # shorter than the feeds, so the window masks something
        "attn_logit_softcapping": 2.0,  # Gemma 2 uses 50; small enough here to change the random scores
        **NO_CACHE,
    },
)
_gemma3 = _hf(  # Gemma 3: RMS-normed Q and K, four norms a layer, sliding-window and global layers, GQA, RoPE
    "Gemma3TextConfig",
    "Gemma3TextModel",
    _ids,
    {**LLAMA_SIZES, "head_dim": HIDDEN // HEADS, "sliding_window": 4, **NO_CACHE},
)
# float16 decoders whose norms or rotations compute in float32 between casts, each spelled its own way:
# Cohere's layer norm and tables cast to float16 and back, ERNIE 4.5's interleaved rotate in float16 cast up,
# OLMo 2's normed Q and K, ModernBERT's x cast once for each rotation term
_cohere = _hf("CohereConfig", "CohereModel", _ids, {**LLAMA_SIZES, **NO_CACHE})
_ernie45 = _hf("Ernie4_5Config", "Ernie4_5Model", _ids, {**LLAMA_SIZES, "head_dim": HIDDEN // HEADS, **NO_CACHE})
_olmo2 = _hf("Olmo2Config", "Olmo2Model", _ids, {**LLAMA_SIZES, **NO_CACHE})
_modernbert = _hf(
    "ModernBertConfig",
    "ModernBertModel",
    _ids,
    {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
     "num_attention_heads": HEADS, "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1,
     "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2},
)  # fmt: skip
_t5_encoder = _hf(
    "T5Config",
    "T5EncoderModel",
    _ids,
    {
        "vocab_size": VOCAB,
        "d_model": HIDDEN,
        "d_kv": HIDDEN // HEADS,
        "d_ff": INTER,
        "num_layers": LAYERS,
        "num_heads": HEADS,
        "relative_attention_num_buckets": 8,
        **NO_CACHE,
    },
)
_deberta = _hf("DebertaV2Config", "DebertaV2Model", _ids, {"vocab_size": VOCAB, "hidden_size": HIDDEN,
               "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INTER,
               "max_position_embeddings": 64, "relative_attention": True, "position_buckets": 8,
               "pos_att_type": ["p2c", "c2p"]})  # fmt: skip


PAST = 5


def cache_step(model, cfg):
    """``model`` (a transformers decoder) as one step with a KV cache: ``(input_ids, attention_mask, *past)``
    in, the last hidden state and the present keys/values (as graph tensors) out; with its output names."""
    import torch
    from transformers import DynamicCache

    layers = cfg.num_hidden_layers

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):  # one tuple, like every wrapper here (see ``_dynamic_axes``)
            input_ids, attention_mask, *past = args
            cache = DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True)  # fmt: skip
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state, *present)

    outputs = ["last_hidden_state"] + [f"present_{k}_{i}" for i in range(layers) for k in ("key", "value")]
    return Step().eval(), outputs


def _with_past(make_config, make_model, kv_heads: int):
    """A decoder step with a KV cache: past keys/values in, present keys/values out (as graph tensors)."""

    def build():
        cfg = make_config()
        step, outputs = cache_step(make_model(cfg).eval(), cfg)
        layers = cfg.num_hidden_layers

        rng = np.random.default_rng(0)
        mask = np.ones((2, PAST + 3), np.int64)
        mask[-1, 0] = 0  # left padding in the second sequence
        feeds = {"input_ids": rng.integers(0, VOCAB, (2, 3)).astype(np.int64), "attention_mask": mask}
        for i in range(layers):
            for kind in ("key", "value"):
                shape = (2, kv_heads, PAST, HIDDEN // HEADS)
                feeds[f"past_{kind}_{i}"] = rng.standard_normal(shape).astype(np.float32)
        return step, feeds, outputs

    return build


def _gpt2_past(impl: str):
    from_config = lambda cfg: __import__("transformers").GPT2Model(cfg)  # noqa: E731

    def config():
        from transformers import GPT2Config

        return GPT2Config(**GPT2_SIZES, attn_implementation=impl)

    return _with_past(config, from_config, HEADS)


def _llama_past(impl: str):
    from_config = lambda cfg: __import__("transformers").LlamaModel(cfg)  # noqa: E731

    def config():
        from transformers import LlamaConfig

        return LlamaConfig(**LLAMA_SIZES, attn_implementation=impl)

    return _with_past(config, from_config, HEADS // 2)


def _gpt_oss_past(impl: str):
    """A gpt-oss step with a KV cache: the sinks' zero key after the cached and the new keys. Full attention in
    both layers: torch.export cannot keep the cache's length symbolic through a sliding-window layer's cache."""
    from_config = lambda cfg: __import__("transformers").GptOssModel(cfg)  # noqa: E731

    def config():
        from transformers import GptOssConfig

        return GptOssConfig(**{**LLAMA_SIZES, **_GPT_OSS_SIZES}, layer_types=["full_attention"] * LAYERS,
                            attn_implementation=impl)  # fmt: skip

    return _with_past(config, from_config, HEADS // 2)


def _bart_decoder_past(impl: str):
    """A BART decoder step with both caches: self-attention K/V grow by Concat(past, new); cross-attention K/V
    are the cached encoder projections themselves (``EncoderDecoderCache`` with the cross cache filled)."""

    def build():
        import torch
        import transformers
        from transformers import DynamicCache, EncoderDecoderCache

        cfg = transformers.BartConfig(**SEQ2SEQ_SIZES, max_position_embeddings=64, attn_implementation=impl)
        decoder = transformers.BartModel(cfg).get_decoder().eval()
        layers = cfg.decoder_layers

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.decoder = decoder

            def forward(self, *args):
                input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, *past = args
                own, cross = DynamicCache(config=cfg), DynamicCache(config=cfg)
                for i in range(layers):
                    own.update(past[4 * i], past[4 * i + 1], i)
                    cross.update(past[4 * i + 2], past[4 * i + 3], i)
                out = self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                                   encoder_hidden_states=encoder_hidden_states,
                                   encoder_attention_mask=encoder_attention_mask,
                                   past_key_values=EncoderDecoderCache(own, cross), use_cache=True)  # fmt: skip
                own_layers = out.past_key_values.self_attention_cache.layers
                present = [t for layer in own_layers for t in (layer.keys, layer.values)]
                return (out.last_hidden_state, *present)

        rng = np.random.default_rng(0)
        mask = np.ones((2, PAST + 3), np.int64)
        mask[-1, 0] = 0  # left padding in the second sequence
        encoder_mask = np.ones((2, ENCODED), np.int64)
        encoder_mask[-1, -2:] = 0
        feeds = {
            "input_ids": rng.integers(0, VOCAB, (2, 3)).astype(np.int64),
            "attention_mask": mask,
            "encoder_hidden_states": rng.standard_normal((2, ENCODED, HIDDEN)).astype(np.float32),
            "encoder_attention_mask": encoder_mask,
        }
        for i in range(layers):
            for name, length in (("past", PAST), ("past_cross", ENCODED)):
                for kind in ("key", "value"):
                    feeds[f"{name}_{kind}_{i}"] = rng.standard_normal((2, HEADS, length, HIDDEN // HEADS)).astype(
                        np.float32
                    )
        outputs = ["last_hidden_state"] + [f"present_{k}_{i}" for i in range(layers) for k in ("key", "value")]
        return Wrapper().eval(), feeds, outputs

    return build


def _half(build: Callable, dtype: str = "float16") -> Callable:
    """The same model in half precision (``float16``, or ``bfloat16``: what GPUs run), its weights and float
    inputs (softmax and norms then computed in float32 between casts, as transformers writes them). A bfloat16
    model's float feeds are stored as float32 (npz holds no bfloat16) and cast at export."""

    def half():
        import torch

        model, feeds, outputs = build()
        if dtype == "bfloat16":
            return model.to(torch.bfloat16), feeds, outputs
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
        return model.half(), feeds, outputs

    return half


ENCODED = 6
"""Encoder positions a decoder step attends to across."""
DECODER_STEP = ["mha", "causal", "cross-attention", "kv cache"]
GEMMA2 = ["gqa", "causal", "rope", "sliding window", "softcap"]
HALF_LLAMA = ["gqa", "causal", "rope", "float16"]
DYNAMO = ("dynamo",)


SPECS: dict[str, Spec] = {
    s.name: s
    for s in [
        Spec("bert_eager", _bert("eager"), LAYERS, ["mha", "padding mask"]),
        Spec("bert_sdpa", _bert("sdpa"), LAYERS, ["mha", "padding mask"]),
        Spec("bart_encoder_eager", _bart_encoder("eager"), LAYERS, ["mha", "padding mask"]),
        Spec("bart_encoder_sdpa", _bart_encoder("sdpa"), LAYERS, ["mha", "padding mask"]),
        Spec("vit_eager", _vit("eager"), LAYERS, ["mha"]),
        Spec("vit_sdpa", _vit("sdpa"), LAYERS, ["mha"]),
        Spec("whisper_encoder_eager", _whisper_encoder("eager"), LAYERS, ["mha"]),
        Spec("whisper_encoder_sdpa", _whisper_encoder("sdpa"), LAYERS, ["mha"]),
        Spec("gpt2_eager", _gpt2("eager"), LAYERS, ["mha", "causal"]),
        Spec("gpt2_sdpa", _gpt2("sdpa"), LAYERS, ["mha", "causal"]),
        Spec("llama_eager", _llama("eager"), LAYERS, ["gqa", "causal", "rope"], kv_heads=HEADS // 2),
        Spec("llama_sdpa", _llama("sdpa"), LAYERS, ["gqa", "causal", "rope"], kv_heads=HEADS // 2),
        Spec("gpt2_past_eager", _gpt2_past("eager"), LAYERS, ["mha", "causal", "kv cache"]),
        Spec("gpt2_past_sdpa", _gpt2_past("sdpa"), LAYERS, ["mha", "causal", "kv cache"]),
        Spec(
            "llama_past_eager",
            _llama_past("eager"),
            LAYERS,
            ["gqa", "causal", "rope", "kv cache"],
            kv_heads=HEADS // 2,
        ),
        Spec(
            "llama_past_sdpa",
            _llama_past("sdpa"),
            LAYERS,
            ["gqa", "causal", "rope", "kv cache"],
            kv_heads=HEADS // 2,
        ),
        Spec("bart_eager", _bart("eager"), 3 * LAYERS, ["mha", "causal", "cross-attention"]),
        Spec("bart_sdpa", _bart("sdpa"), 3 * LAYERS, ["mha", "causal", "cross-attention"]),
        Spec("bart_past_eager", _bart_decoder_past("eager"), 2 * LAYERS, DECODER_STEP),
        Spec("bart_past_sdpa", _bart_decoder_past("sdpa"), 2 * LAYERS, DECODER_STEP),
        Spec("whisper_eager", _whisper("eager"), 3 * LAYERS, ["mha", "causal", "cross-attention"]),
        Spec("whisper_sdpa", _whisper("sdpa"), 3 * LAYERS, ["mha", "causal", "cross-attention"]),
        Spec("gemma2_eager", _gemma2("eager"), LAYERS, GEMMA2, kv_heads=HEADS // 2),
        Spec("t5_encoder_eager", _t5_encoder("eager"), LAYERS, ["mha", "attention bias"]),
        # float16 through the dynamo exporter (TorchScript's float16 BERT does not load: a LayerNormalization
        # with float16 input and float32 scale; its float16 Llama's repeat_kv Expand has no inferable shapes)
        Spec("bert_sdpa_fp16", _half(_bert("sdpa")), LAYERS, ["mha", "padding mask", "float16"], exporters=DYNAMO),
        Spec("llama_sdpa_fp16", _half(_llama("sdpa")), LAYERS, HALF_LLAMA, kv_heads=HEADS // 2, exporters=DYNAMO),
        # γ applied in float32 before the narrowing cast (rules/precision.py); Q and K normed too
        Spec(
            "gemma3_sdpa_fp16",
            _half(_gemma3("sdpa")),
            LAYERS,
            [*HALF_LLAMA, "qk norm"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
        *(
            Spec(
                f"{name}_sdpa_fp16", _half(build("sdpa")), LAYERS, [*flavour, "float16"], kv_heads=kv, exporters=DYNAMO
            )
            for name, build, flavour, kv in (
                ("cohere", _cohere, ["gqa", "causal", "rope"], HEADS // 2),
                ("ernie45", _ernie45, ["gqa", "causal", "rope"], HEADS // 2),
                ("olmo2", _olmo2, ["gqa", "causal", "rope", "qk norm"], HEADS // 2),
                ("modernbert", _modernbert, ["mha", "padding mask", "rope"], HEADS),
            )
        ),
        Spec(
            "llama_past_sdpa_fp16",
            _half(_llama_past("sdpa")),
            LAYERS,
            [*HALF_LLAMA, "kv cache"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
        # bfloat16: onnxruntime's CPU provider runs few of its ops, so egfuse validates it on float32 copies
        Spec(
            "bert_sdpa_bf16",
            _half(_bert("sdpa"), "bfloat16"),
            LAYERS,
            ["mha", "padding mask", "bfloat16"],
            exporters=DYNAMO,
        ),
        Spec(
            "llama_sdpa_bf16",
            _half(_llama("sdpa"), "bfloat16"),
            LAYERS,
            [*HALF_LLAMA[:-1], "bfloat16"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
        Spec("deberta_v2_eager", _deberta("eager"), LAYERS, ["mha", "attention bias"]),
        Spec("mpt_eager", _mpt("eager"), LAYERS, ["mha", "causal", "alibi"]),
        Spec("glm_sdpa", _glm("sdpa"), LAYERS, ["gqa", "causal", "rope interleaved"], kv_heads=HEADS // 2),
        Spec("bitnet_sdpa", _bitnet("sdpa"), LAYERS, ["gqa", "causal", "rope", "sub-norm"], kv_heads=HEADS // 2),
        Spec("vitdet_eager", _vitdet("eager"), LAYERS, ["mha", "windows", "decomposed relative positions"]),
        Spec("sam_vision_sdpa", _sam_vision("sdpa"), LAYERS, ["mha", "windows", "relative positions as a mask"]),
        Spec("roformer_eager", _roformer("eager"), LAYERS, ["mha", "rope interleaved"], exporters=DYNAMO),
        Spec(
            "gpt_neox_eager",
            _gpt_neox("eager"),
            LAYERS,
            ["mha", "causal", "rope partial", "parallel residual"],
            exporters=(),
        ),  # exported only at an old opset (the old_opsets set)
        Spec(
            "longt5_encoder_eager",
            _longt5_encoder("eager"),
            LAYERS,
            ["mha", "blocks", "position bias"],
            exporters=DYNAMO,
        ),
        Spec(
            "gpt_oss_eager",
            _gpt_oss("eager"),
            LAYERS,
            ["gqa", "causal", "sliding window", "sinks", "rope halves apart", "moe"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
        Spec(
            "deepseek_v3_eager",
            _deepseek_v3("eager"),
            LAYERS,
            ["mha", "causal", "mla", "rope halves apart, strided, after the rest", "moe, sigmoid router"],
            exporters=DYNAMO,
        ),
        Spec(
            "gemma4_sdpa",
            _gemma4("sdpa"),
            LAYERS,
            ["gqa", "causal", "sliding window", "norms as a power of −½", "q/k/v norms"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
        Spec(
            "gpt_oss_past_eager",
            _gpt_oss_past("eager"),
            LAYERS,
            ["gqa", "causal", "kv cache", "sinks", "rope halves apart", "moe"],
            kv_heads=HEADS // 2,
            exporters=DYNAMO,
        ),
    ]
}

HALF_SUFFIX = {"float16": "_fp16", "bfloat16": "_bf16"}


def _half_specs() -> dict[str, Spec]:
    """Every float32 corpus architecture again in float16 and in bfloat16, through the dynamo exporter (the one
    that writes half-precision models onnxruntime loads: TorchScript's float16 BERT does not), for the
    half-precision coverage (``experiments/half_coverage.py``). The hand-written half specs above keep their
    names (the tests' corpus); these are generated alongside them."""
    specs = {}
    for spec in list(SPECS.values()):
        if spec.name.endswith(tuple(HALF_SUFFIX.values())):
            continue
        for dtype, suffix in HALF_SUFFIX.items():
            name = spec.name + suffix
            if name not in SPECS:
                specs[name] = Spec(name, _half(spec.build, dtype), spec.blocks, [*spec.flavour, dtype], spec.heads,
                                   spec.kv_heads, spec.head_dim, DYNAMO)  # fmt: skip
    return specs


SPECS.update(_half_specs())

SETS = {
    "tests": [
        "bert_eager",
        "bert_sdpa",
        "bart_encoder_eager",
        "bart_encoder_sdpa",
        "vit_eager",
        "vit_sdpa",
        "whisper_encoder_eager",
        "whisper_encoder_sdpa",
        "gpt2_sdpa",
        "gpt2_past_sdpa",
        "llama_eager",
        "llama_past_eager",
        "llama_sdpa",
        "bart_sdpa",
        "bart_past_sdpa",
        "whisper_sdpa",
        "t5_encoder_eager",
        "deberta_v2_eager",
        "gemma2_eager:dynamo",
    ],
    "half": [
        "bert_sdpa_fp16",
        "llama_sdpa_fp16",
        "llama_past_sdpa_fp16",
        "bert_sdpa_bf16",
        "llama_sdpa_bf16",
        "mpt_eager_fp16",
        "mpt_eager_bf16",
        "llama_past_sdpa_bf16",
        "gemma3_sdpa_fp16",
        "gpt2_sdpa_bf16",
        "cohere_sdpa_fp16",
        "ernie45_sdpa_fp16",
        "olmo2_sdpa_fp16",
        "modernbert_sdpa_fp16",
    ],  # MPT: scores upcast before a float32 ALiBi bias and select; a bfloat16 decode step (√s on Q and K);
    # GPT-2's tanh GELU, whose constants bfloat16 rounds (√(2/π) is 0.796875 there)
    # architectures that broke egfuse on a model it had not seen (tests/exports/test_held_out.py)
    "held_out": [
        "mpt_eager",
        "glm_sdpa",
        "bitnet_sdpa",
        "vitdet_eager",
        "sam_vision_sdpa",
        "roformer_eager",
        "longt5_encoder_eager",
        "gpt_oss_eager",
        "gpt_oss_past_eager",
        "deepseek_v3_eager",
        "gemma4_sdpa",
    ],
    # TorchScript exports at the opsets old exports have (HF's transformers.onnx and optimum wrote 11-14 for years):
    # below 13 Softmax flattens from its axis, and up to 13 onnx's data propagation does not run through their
    # shape arithmetic (tests/exports/test_old_opsets.py)
    "old_opsets": [
        f"{name}:torchscript-opset{opset}" for name in ("bert_eager", "gpt2_eager", "llama_eager") for opset in (11, 13)
    ]
    + ["gpt_neox_eager:torchscript-opset13"],
    "all": [name for name in SPECS if not name.endswith(("_fp16", "_bf16"))],  # the float32 corpus the results measure
    "half_all": [name for name in SPECS if name.endswith(("_fp16", "_bf16"))],
}


def _dynamic_axes(name: str, array: np.ndarray, with_past: bool) -> dict[int, str]:
    """Symbolic dim names of one input. With a KV cache the mask spans past + new tokens (``total_sequence``);
    cached cross-attention K/V and the encoder's outputs span the encoder's positions."""
    if name.startswith("past_"):
        return {0: "batch", 2: "encoder_sequence" if "cross" in name else "past_sequence"}
    if name.startswith("encoder_"):
        return {0: "batch", 1: "encoder_sequence"}
    if array.ndim != 2:
        return {0: "batch"}
    if name.startswith("decoder"):
        return {0: "batch", 1: "decoder_sequence"}
    return {0: "batch", 1: "total_sequence" if name == "attention_mask" and with_past else "sequence"}


def _name_total_length(path: Path) -> None:
    """torch.export names the mask's length (past + new, a relation it cannot state) ``sNN``: call it
    ``total_sequence``, as the TorchScript export does, so feeds can be drawn consistently."""
    import onnx

    model = onnx.load(path)
    mask = next(i for i in model.graph.input if i.name == "attention_mask")
    symbol = mask.type.tensor_type.shape.dim[1].dim_param
    for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param == symbol:
                dim.dim_param = "total_sequence"
    onnx.save(model, path)


@contextlib.contextmanager
def _quiet_fds():
    """Silence stdout/stderr at the file-descriptor level: the TorchScript exporter prints whole IR graphs
    from C++ on failure, past Python's redirect_stdout."""
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def export(spec: Spec, exporter: str, out_dir: Path) -> Entry:
    import torch

    entry = Entry(spec.name, exporter, None, spec.blocks, spec.flavour, spec.heads, spec.kv_heads, spec.head_dim)
    start = time.perf_counter()
    try:
        torch.manual_seed(0)
        model, feeds, outputs = spec.build()
        with_past = any(n.startswith("past_") for n in feeds)
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        weights_type = next(model.parameters()).dtype
        if weights_type == torch.bfloat16:  # npz holds no bfloat16: the float feeds are stored as float32
            args = tuple(a.to(weights_type) if a.dtype == torch.float32 else a for a in args)
        names = list(feeds)
        path = out_dir / f"{spec.name}.{exporter}.onnx"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet_fds():
            warnings.simplefilter("ignore")
            axes = {n: _dynamic_axes(n, feeds[n], with_past) for n in names}
            if exporter.startswith("torchscript"):  # "torchscript-opset11": an older opset, as old exports have
                torch.onnx.export(
                    model,
                    args,
                    str(path),
                    input_names=names,
                    output_names=outputs,
                    dynamic_axes=axes,
                    opset_version=int(exporter.partition("-opset")[2] or 17),
                    dynamo=False,
                )
            else:
                # torch.export cannot state total = past + new: that length is left for it to name (AUTO).
                dims = {
                    "batch": torch.export.Dim("batch", min=1, max=64),
                    "total_sequence": torch.export.Dim.AUTO,
                    **{d: torch.export.Dim(d, min=2, max=60) for d in ("sequence", "decoder_sequence")},
                    **{d: torch.export.Dim(d, min=1, max=60) for d in ("past_sequence", "encoder_sequence")},
                }
                # Every wrapper takes ``*args``: torch.export sees one tuple-valued input.
                dyn = (tuple({axis: dims[d] for axis, d in axes[n].items()} for n in names),)
                program = torch.onnx.export(
                    model,
                    args,
                    input_names=names,
                    output_names=outputs,
                    dynamic_shapes=dyn,
                    opset_version=18,
                    dynamo=True,
                )
                program.save(str(path))
                if with_past:
                    _name_total_length(path)
        entry.file = path.name
        entry.inputs = {n: {"shape": list(v.shape), "dtype": str(v.dtype)} for n, v in feeds.items()}
        np.savez(out_dir / f"{spec.name}.{exporter}.feeds.npz", **feeds)
    except Exception as err:  # recorded, not dropped
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        summary = next((line for line in reversed(lines) if "Error" in line or "not supported" in line), "")
        entry.error = f"{type(err).__name__}: {(summary or (lines[0] if lines else ''))[:300]}"
        traceback.print_exc(limit=2, file=sys.stderr)
    entry.export_seconds = round(time.perf_counter() - start, 2)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("experiments/corpus"))
    parser.add_argument("--set", choices=list(SETS), default="all")
    parser.add_argument("--only", nargs="*", help="model names (default: the whole set)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.only or SETS[args.set]
    jobs = []
    for item in names:  # "name" exports with every exporter, "name:exporter" with that one
        name, _, only = item.partition(":")
        jobs += [(SPECS[name], e) for e in SPECS[name].exporters if not only or e == only]
        if only.startswith("torchscript-opset"):  # TorchScript at an older opset than the corpus's
            jobs.append((SPECS[name], only))
    entries = []
    for i, (spec, exporter) in enumerate(jobs, 1):
        print(f"[{i:>3}/{len(jobs)}] {spec.name:<28} {exporter:<12}", end=" ", flush=True)
        entry = export(spec, exporter, args.out)
        print(
            "ok" if entry.error is None else f"FAILED: {entry.error}",
            f"({entry.export_seconds}s)",
            flush=True,
        )
        entries.append(entry)
    path = args.out / "manifest.json"
    rows = [asdict(e) for e in entries]
    if args.only and path.exists():  # a partial re-export updates its rows and keeps the others
        fresh = {(r["name"], r["exporter"]) for r in rows}
        kept = [r for r in json.loads(path.read_text())["models"] if (r["name"], r["exporter"]) not in fresh]
        rows = kept + rows
    manifest = {"hidden": HIDDEN, "heads": HEADS, "layers": LAYERS, "models": rows}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    failed = [e for e in entries if e.error]
    print(f"{len(entries) - len(failed)}/{len(entries)} exported → {args.out / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
