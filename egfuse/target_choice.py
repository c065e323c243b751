"""The target a run fuses for: the registered one named, priced for the execution provider the user runs on,
with the fused ops the region kinds bring (:func:`egfuse.kinds.registry.offered`), optimizing for the sizes
given, without RoPE where asked, and without the opset-23 ops where the model's opset must stay."""

from __future__ import annotations

from dataclasses import replace

from egfuse.errors import EgfuseError
from egfuse.kinds.registry import offered
from egfuse.targets import for_provider, get_target
from egfuse.targets.spec import STANDARD_ATTENTION_OPSET, TargetSpec

__all__ = ["for_run", "get_target"]


def for_run(
    named: TargetSpec,
    providers: tuple[str, ...],
    *,
    shapes: dict[str, int] | None,
    rotary: bool,
    raise_opset: bool,
    opset: int,
    source: str,
) -> tuple[TargetSpec, bool]:
    """The target to fuse ``source`` (at ``opset``) for, and whether another provider's costs price it. A model
    whose opset may not be raised keeps the contrib ops only; a target that needs opset 23 is refused then."""
    chosen = for_provider(named, providers)
    priced = chosen is not named  # another provider's costs
    chosen = offered(chosen)
    if shapes is not None:
        chosen = chosen.for_shapes(shapes)
    if not rotary:
        chosen = replace(chosen, no_rotary="RoPE fusion turned off (rotary=False / --no-rope)")
    if not raise_opset and opset < STANDARD_ATTENTION_OPSET:
        if chosen.requires_standard_opset:
            raise EgfuseError(
                f"target {chosen.name!r} writes opset-{STANDARD_ATTENTION_OPSET} ops and the opset may not be raised "
                f"(raise_opset=False / --keep-opset); the model is at opset {opset}: use --target ort",
                path=source,
            )
        kept = "RotaryEmbedding needs opset 23 and the model's opset is kept (raise_opset=False / --keep-opset)"
        chosen = replace(chosen.below_opset(opset), no_rotary=chosen.no_rotary or kept)
    return chosen, priced
