"""Rewrite rule sets, one family a file. Each rule states an algebraic identity that holds for any model;
conditions are facts on e-classes (``scalar_of``, ``rank_of``, ``finite``), never names or shapes of a corpus.

* ``commute``   — canonical operand order (constant second, scores first) instead of general AC rules
* ``layout``    — transpose composition, reshape inverses, scalars and guards moving through layout ops
* ``scale``     — every placement of the 1/√d scale folds into ``scores``' scale
* ``softcap``   — Gemma 2's ``c · tanh(x / c)`` on the scores
* ``masks``     — select masks become additive, bias and scale distribute, the NaN guard is recognised
* ``precision`` — a half-precision model's float32 softmax and norms (Cast → f → Cast) are f itself
* ``attention`` — ``softmax(scores + bias) @ V`` becomes ``attend``
* ``heads``     — heads folded into the batch (B·N, S, H) or absent (B, S, H): attention under ``merge_lead``
* ``windows``   — a window axis before the heads (B, W, N, S, H): attention on the folded (B·W) batch
* ``groups``    — query heads in groups of one KV head (B, K, G, T, H), or stacked as rows (B·K, G·T, H): GQA
* ``clamp``     — a clamp at a very negative value under the softmax (OPT's max(scores, finfo.min))
* ``qbias``     — biases that read Q (relative positions, gates): the scores term moved out of the sum
* ``pieces``    — attention computed in parts (a split-score KV cache, heads one by one) joined is attention
* ``sinks``     — a sink's logit beside the scores (gpt-oss) is a zero key's bias; a stable softmax's shift
* ``norms``     — every spelling of layer and RMS normalization is ``layer_norm`` / ``rms_norm``
* ``gelu``      — every spelling of the exact GELU is ``gelu`` (√2 divided or 1/√2 multiplied, ½ anywhere)
* ``tanh_gelu`` — every spelling of the tanh GELU is ``gelu_tanh`` (its own constructors: :data:`CONSTRUCTORS`)
* ``rotary``    — RoPE (rotate-half or interleaved, full or partial) whose tables are proven to repeat what the
  op reads is ``rotary``
* ``ort``       — the com.microsoft ops (MultiHeadAttention, packed-QKV Attention) as equal terms
"""

from __future__ import annotations

import functools

from egfuse.rules import (
    attention,
    clamp,
    commute,
    facts,
    gelu,
    groups,
    heads,
    layout,
    masks,
    norms,
    ort,
    pieces,
    precision,
    qbias,
    rotary,
    scale,
    sinks,
    softcap,
    tanh_gelu,
    windows,
)
from egglog import Ruleset, unstable_combine_rulesets

CORE_FAMILIES: dict[str, Ruleset] = {
    "facts": facts.rules, "commute": commute.rules, "layout": layout.rules, "scale": scale.rules,
    "softcap": softcap.rules, "masks": masks.rules, "precision": precision.rules, "attention": attention.rules,
    "heads": heads.rules, "heads.weights": heads.weights, "clamp": clamp.rules, "qbias": qbias.rules,
    "pieces": pieces.rules, "sinks": sinks.rules, "norms": norms.rules, "gelu": gelu.rules, "rotary": rotary.rules,
    "windows": windows.rules, "groups": groups.rules, "tanh_gelu": tanh_gelu.rules,
}  # fmt: skip
"""The target-independent families, by the name their rules carry."""

CONSTRUCTORS: dict[str, object] = {**tanh_gelu.CONSTRUCTORS, **ort.CONSTRUCTORS}
"""Constructors a family declares itself (a region kind's fused op and its canonical steps), by name: part of
the e-graph's language beside :class:`egfuse.egraph.lang.Tensor`'s, read back and viewed like them."""

CORE: Ruleset = unstable_combine_rulesets(*CORE_FAMILIES.values())
"""Target-independent: every spelling of attention lands in one e-class with ``attend``."""

FAMILIES: dict[str, Ruleset] = {"ort": ort.rules}
"""Rule families a target may ask for beyond the core (``TargetSpec.rule_families``): forms only its ops take.
(Whatever the families, an e-graph loads only the rules that can fire on its terms: :mod:`egfuse.egraph.rule_reach`.)"""

NAMED: dict[str, Ruleset] = {**CORE_FAMILIES, **FAMILIES}
"""Every family by the name its rules carry."""


@functools.cache
def rule_names() -> dict[object, str]:
    """Each rule's stable name, ``family.position`` (its place among the family file's rules, in order): what
    the report counts rule applications by. Keys are egglog-python's rule declarations."""
    names: dict[object, str] = {}
    for family, ruleset in NAMED.items():
        for position, decl in enumerate(ruleset.__egg_decls__._rulesets[ruleset.ident].rules):
            names.setdefault(decl, f"{family}.{position}")
    return names


@functools.cache
def ruleset_for(families: tuple[str, ...]) -> Ruleset:
    """The core and the named families, as one ruleset — built once per combination: egglog-python gathers a
    new ruleset object's declarations again (about a second per e-graph). One flat union: a union of unions
    (``a | b | c``) gathers each level's declarations again for every level above it, twice (a protocol check
    reads them too), so its cost doubled with each family added (2.9 s for 16 families, 0.3 s flat)."""
    ruleset = unstable_combine_rulesets(*CORE_FAMILIES.values(), *(FAMILIES[name] for name in families))
    _FAMILIES_OF[id(ruleset)] = families  # kept alive by the cache above: its id stays its own
    return ruleset


_FAMILIES_OF: dict[int, tuple[str, ...]] = {}


def families_of(ruleset: Ruleset) -> tuple[str, ...] | None:
    """The families :func:`ruleset_for` made ``ruleset`` of; None for any other ruleset. What names a ruleset's
    egglog program on disk (:mod:`egfuse.egraph.egg_program`): the families and the sources say what its rules are."""
    return _FAMILIES_OF.get(id(ruleset))


__all__ = [
    "CONSTRUCTORS",
    "CORE",
    "FAMILIES",
    "NAMED",
    "attention",
    "clamp",
    "commute",
    "facts",
    "families_of",
    "gelu",
    "groups",
    "heads",
    "layout",
    "masks",
    "norms",
    "ort",
    "pieces",
    "precision",
    "qbias",
    "rule_names",
    "ruleset_for",
    "scale",
    "softcap",
    "tanh_gelu",
    "windows",
]  # fmt: skip
