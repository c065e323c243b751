"""The diffusers producers corpus: attention as diffusion models write it, exported by both torch exporters.

Four model classes of ``diffusers``, each built from its config with tiny random weights (nothing is downloaded):

- ``unet``: ``UNet2DConditionModel`` (Stable Diffusion 1.x/2.x layout): spatial transformer blocks with self-attention
  over the latent pixels and cross-attention to the text tokens (16 channels, 2 heads of 8; one level at 8×8: a
  down block, the mid block, an up block), the text tokens padded by ``encoder_attention_mask`` (diffusers turns
  it into an additive ``(1 − m)·−10000`` bias);
- ``dit``: ``DiTTransformer2DModel``: class-conditional ViT over latent patches, adaLN-zero;
- ``sd3``: ``SD3Transformer2DModel`` (SD3 medium): MMDiT joint attention, image and text tokens projected
  separately and attended together (``JointAttnProcessor2_0``), the last block's context pre-only;
- ``sd35``: the same class as SD3.5 configures it: RMS-normed queries and keys, and one block with a second,
  image-only self-attention (``dual_attention_layers``);
- ``flux``: ``FluxTransformer2DModel``: one double-stream (joint) block and two single-stream blocks, RMS-normed
  queries and keys, 3-axis RoPE from ``img_ids``/``txt_ids`` (``FluxAttnProcessor`` through diffusers' attention
  dispatcher, its default backend ``native`` = ``F.scaled_dot_product_attention``).

Each is exported with diffusers' default processor (``F.scaled_dot_product_attention``: ``AttnProcessor2_0``,
``JointAttnProcessor2_0``, ``FluxAttnProcessor``; suffix ``_fused``) and, where the class has one, with the eager
``AttnProcessor`` (``baddbmm`` of the scores, softmax, ``bmm``; suffix ``_eager``; ``set_processor`` on each module).
Joint attention (SD3) and Flux's attention have no eager processor in diffusers: those are exported only as
``_fused`` (listed in the manifest's ``no_eager_processor``). The exporters, the check on onnxruntime against
torch, the forked runner and the manifest are ``producers_timm.py``'s (``blocks``: forward hooks on diffusers'
attention modules — ``Attention``, ``FluxAttention``: every class with ``AttentionModuleMixin`` — counting the
calls executed on the feeds), except that the dynamo exports' per-node metadata (Python stacks with this
machine's paths: two thirds of their bytes, no computation) is dropped before the check.

Environment: the timm venv (experiments/requirements-timm.txt) plus diffusers
(experiments/requirements-diffusers.txt, which includes the timm one; transformers is not needed)::

    /work/venvs/timm/bin/pip install -r experiments/requirements-diffusers.txt
    /work/venvs/timm/bin/python experiments/producers_diffusers.py               # every model
    /work/venvs/timm/bin/python experiments/producers_diffusers.py --only flux   # re-export some
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import producers_timm  # experiments/ is not a package
from producers_timm import BATCH, Spec

PRODUCER = "diffusers"
PACKAGES = ("diffusers", "torch", "onnx", "onnxruntime", "onnxscript", "numpy")
TEXT = 7  # text tokens
WIDTH = 32  # hidden size; 4 heads of 8


def _attention_modules(model) -> list:
    """diffusers' attention modules: ``Attention`` and the newer per-model classes (``FluxAttention``), all of
    which mix in ``AttentionModuleMixin`` (or are ``Attention``)."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    return [m for m in model.modules() if isinstance(m, Attention | AttentionModuleMixin)]


def _configure(model, impl: str) -> None:
    """``_eager``: every attention module gets the eager ``AttnProcessor``; ``_fused``: the processors the modules
    were built with, which must call ``F.scaled_dot_product_attention`` (checked, not assumed)."""
    from diffusers.models.attention_processor import AttnProcessor

    if impl == "eager":  # what ``set_attn_processor(AttnProcessor())`` does, on the wrapped model
        for module in _attention_modules(model):
            module.set_processor(AttnProcessor())
    processors = {type(m.processor).__name__ for m in _attention_modules(model)}
    fused = {"AttnProcessor2_0", "JointAttnProcessor2_0", "FluxAttnProcessor"}
    wanted = {"AttnProcessor"} if impl == "eager" else fused
    if not processors <= wanted:
        raise ValueError(f"attention processors {sorted(processors)} are not the {impl} ones")


def _build(make: Callable[[], Any], names: list[str]) -> Callable[[], Any]:
    """The diffusers model taking its inputs positionally, returning its output tensor only. ``forward`` is given
    the signature ``(self, <feed names>)``: ``torch.export`` matches its ``dynamic_shapes`` to the parameters."""

    def build():
        import inspect

        import torch

        class Sample(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = make()

            def forward(self, *inputs):
                return self.model(**dict(zip(names, inputs, strict=True)), return_dict=False)[0]

        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ["self", *names]]
        Sample.forward.__signature__ = inspect.Signature(params)
        return Sample()

    return build


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _latents(channels: int = 4, size: int = 8) -> np.ndarray:
    return _rng().standard_normal((BATCH, channels, size, size)).astype(np.float32)


def _text(width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((BATCH, TEXT, width)).astype(np.float32)


def _timestep() -> np.ndarray:
    return np.array([999.0, 10.0][:BATCH], dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Models


def _unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16,), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D",), up_block_types=("CrossAttnUpBlock2D",),
        cross_attention_dim=WIDTH, attention_head_dim=2, norm_num_groups=4,  # attention_head_dim: the heads (#2011)
    )  # fmt: skip


def _unet_feeds() -> dict[str, np.ndarray]:
    mask = np.ones((BATCH, TEXT), dtype=np.int64)
    mask[0, 5:] = 0  # the first prompt is two tokens shorter
    return {"sample": _latents(), "timestep": _timestep(), "encoder_hidden_states": _text(),
            "encoder_attention_mask": mask}  # fmt: skip


def _dit():
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(num_attention_heads=4, attention_head_dim=8, in_channels=4, num_layers=2,
                                 sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=8)  # fmt: skip


def _dit_feeds() -> dict[str, np.ndarray]:
    return {"hidden_states": _latents(), "timestep": _timestep(), "class_labels": np.array([3, 7][:BATCH])}


def _sd3(**extra: Any) -> Callable[[], Any]:
    def make():
        from diffusers import SD3Transformer2DModel

        return SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
            joint_attention_dim=WIDTH, caption_projection_dim=WIDTH, pooled_projection_dim=16, out_channels=4,
            pos_embed_max_size=8, **extra,
        )  # fmt: skip

    return make


def _sd3_feeds() -> dict[str, np.ndarray]:
    pooled = np.random.default_rng(2).standard_normal((BATCH, 16)).astype(np.float32)
    return {"hidden_states": _latents(), "encoder_hidden_states": _text(), "pooled_projections": pooled,
            "timestep": _timestep()}  # fmt: skip


FLUX_IMAGE = 4  # a 4×4 grid of packed latent tokens


def _flux():
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=8,
                                  num_attention_heads=4, joint_attention_dim=WIDTH, pooled_projection_dim=16,
                                  guidance_embeds=False, axes_dims_rope=(2, 2, 4))  # fmt: skip


def _flux_feeds() -> dict[str, np.ndarray]:
    tokens = FLUX_IMAGE * FLUX_IMAGE
    image = _rng().standard_normal((BATCH, tokens, 16)).astype(np.float32)
    pooled = np.random.default_rng(2).standard_normal((BATCH, 16)).astype(np.float32)
    img_ids = np.zeros((tokens, 3), dtype=np.float32)  # (0, row, column) as the Flux pipeline writes them
    img_ids[:, 1], img_ids[:, 2] = np.divmod(np.arange(tokens), FLUX_IMAGE)
    return {"hidden_states": image, "encoder_hidden_states": _text(), "pooled_projections": pooled,
            "timestep": _timestep() / 1000, "img_ids": img_ids, "txt_ids": np.zeros((TEXT, 3), np.float32)}  # fmt: skip


def _drop_node_metadata(path: Path, exporter: str) -> None:
    """The dynamo exporter's per-node ``metadata_props`` (each node's Python stack, module path and class, with
    this machine's site-packages paths) dropped: two thirds of each diffusers export's bytes, and no computation."""
    import onnx

    if exporter != "dynamo":
        return
    model = onnx.load(str(path))
    for graph in [model.graph, *model.functions]:
        for node in graph.node:
            del node.metadata_props[:]
    onnx.save(model, str(path))


def _spec(name: str, make: Callable[[], Any], feeds: Callable[[], dict[str, np.ndarray]], flavour: list[str],
          impls: tuple[str, ...] = ("fused", "eager"), batched: tuple[str, ...] | None = None, heads: int = 4
          ) -> Spec:  # fmt: skip
    """Output ``prediction``: not ``sample``, the UNet's input (an input and an output of one name is no graph)."""
    return Spec(name, _build(make, list(feeds())), feeds, flavour, heads, producer=PRODUCER, impls=impls,
                configure=_configure, modules=_attention_modules, batched=batched, outputs=("prediction",),
                rewrite=_drop_node_metadata)  # fmt: skip


DIFFUSION = ["mha", "diffusion"]
SPECS: list[Spec] = [
    _spec("unet", _unet, _unet_feeds, [*DIFFUSION, "cross attention", "padding mask", "unet"], heads=2),
    _spec("dit", _dit, _dit_feeds, [*DIFFUSION, "adaln-zero"]),
    _spec("sd3", _sd3(), _sd3_feeds, [*DIFFUSION, "joint attention"], impls=("fused",)),
    _spec("sd35", _sd3(qk_norm="rms_norm", dual_attention_layers=(0,)), _sd3_feeds,
          [*DIFFUSION, "joint attention", "qk norm"], impls=("fused",)),
    _spec("flux", _flux, _flux_feeds, [*DIFFUSION, "joint attention", "single-stream attention", "qk norm", "rope"],
          impls=("fused",), batched=("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep")),
]  # fmt: skip
NO_EAGER = sorted(f"{s.name}_eager" for s in SPECS if "eager" not in s.impls)


def main(argv: list[str] | None = None) -> int:
    extra = {"no_eager_processor": NO_EAGER}  # the classes diffusers gives no eager processor: _fused only
    return producers_timm.producer_main(argv, __doc__, PRODUCER, SPECS, PACKAGES, extra)


if __name__ == "__main__":
    sys.exit(main())
