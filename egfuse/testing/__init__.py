"""Build attention subgraphs in any of the spellings exporters use — for tests, fuzzing and bug reports.

``attention_model(Variant(...))`` writes one self-attention block (projections → heads → scores → mask →
softmax → @V → merged heads) as plain ONNX ops, with each spelling choice independent of the others. The
hypothesis strategy ``variants()`` draws those choices at random, so users can fuzz their own rules the
way egfuse's property tests do.

:mod:`~egfuse.testing.axes` holds the axes, :mod:`~egfuse.testing.variant` :class:`Variant` and
:mod:`~egfuse.testing.repair` what makes free draws combine; :mod:`~egfuse.testing.model` writes the block part by
part (:mod:`~egfuse.testing.block_state`, :mod:`~egfuse.testing.probabilities`) from :mod:`~egfuse.testing.blocks`
and :mod:`~egfuse.testing.rope`; :mod:`~egfuse.testing.feeds` and
:mod:`~egfuse.testing.functions` give inputs and the dynamo exporter's function-wrapped form;
:mod:`~egfuse.testing.agree` judges any optimizer's output against the original as egfuse's validation does.
"""

from egfuse.testing.agree import disagreements
from egfuse.testing.axes import (
    AXES,
    CACHE_READS,
    CAUSAL,
    CONCATS,
    DROPOUTS,
    DTYPES,
    HEAD_LAYOUTS,
    K_LAYOUTS,
    MASKS,
    MATMULS,
    QDQ,
    QUERY_BIASES,
    ROPE_TABLES,
    SCALES,
    SOFTCAP,
    SOFTCAPS,
)
from egfuse.testing.feeds import feeds_for
from egfuse.testing.functions import default_opset_of, in_functions
from egfuse.testing.model import attention_model
from egfuse.testing.variant import Variant, canonical, variants

__all__ = [
    "AXES",
    "CACHE_READS",
    "CAUSAL",
    "CONCATS",
    "DROPOUTS",
    "DTYPES",
    "HEAD_LAYOUTS",
    "K_LAYOUTS",
    "MASKS",
    "MATMULS",
    "QDQ",
    "QUERY_BIASES",
    "ROPE_TABLES",
    "SCALES",
    "SOFTCAP",
    "SOFTCAPS",
    "Variant",
    "attention_model",
    "canonical",
    "default_opset_of",
    "disagreements",
    "feeds_for",
    "in_functions",
    "variants",
]
