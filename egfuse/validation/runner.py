"""Running models on onnxruntime for validation: quiet sessions (errors come back as exceptions, never
printed), large models loaded from a file so their weights are mapped, extra outputs for region values, and the
feeds the original runs on.

The settings of the ``fuse()`` call under way (tolerances, providers) live here too, so every run reads them
from one place.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from egfuse.files import protos
from egfuse.validation import memory
from egfuse.validation.inputs import long_dims, make_feeds, related_bindings

__all__ = [
    "DEFAULTS",
    "Precomputed",
    "Settings",
    "current",
    "original_outputs",
    "precomputed",
    "run",
    "session",
    "using",
    "with_outputs",
]

ATOL = 1e-4
RTOL = 1e-3
HALF_TOLERANCE = 1e-2
"""float16/bfloat16 outputs without a float32 reference: ~10 ulps of float16 (absolute and relative)."""


@dataclass(frozen=True)
class Settings:
    """How validation runs and judges: the float32 tolerances and onnxruntime's execution providers."""

    atol: float = ATOL
    rtol: float = RTOL
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    ahead: bool = os.environ.get("EGFUSE_RUN_AHEAD", "1") != "0"
    """Run the original model's side of validation in a second process while the search goes on, where it can
    (:mod:`egfuse.validation.ahead`): the same runs and the same verdicts, sooner. ``EGFUSE_RUN_AHEAD=0`` in the
    environment turns it off by default (where processes may not be forked)."""


DEFAULTS = Settings()
_SETTINGS: ContextVar[Settings | None] = ContextVar("egfuse_validation_settings", default=None)
"""The settings of the ``fuse()`` call under way (:func:`using`); :data:`DEFAULTS` otherwise."""


def current() -> Settings:
    return _SETTINGS.get() or DEFAULTS


@contextmanager
def using(settings: Settings | None) -> Iterator[None]:
    """Validation inside the block runs and judges by ``settings`` (the defaults where None)."""
    with _bound(_SETTINGS, settings):
        yield


@contextmanager
def _bound(var: ContextVar, value: object) -> Iterator[None]:
    """``var`` holds ``value`` inside the block, and what it held before after it."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def available(providers: tuple[str, ...]) -> list[str]:
    """The named execution providers this onnxruntime has, in order — the CPU's where it has none of them:
    validation runs on the user's provider when it is there and never requires it."""
    have = set(ort.get_available_providers())
    return [p for p in providers if p in have] or ["CPUExecutionProvider"]


def session(model: onnx.ModelProto, weights: protos.DetachedWeights | None = None) -> ort.InferenceSession:
    """A plain CPU session. A model made from a skeleton (``weights``) reads its large tensors from their
    folder, which onnxruntime maps rather than copies; a large model given whole is written to such a file
    first."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors come back as exceptions, into the report: none printed
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Weights are not repacked for the kernels: that pays off over many runs, and validation runs each model a
    # few times on small feeds. It cost 5 ms of each 48-layer BERT session's 38 (and a packed copy of every
    # MatMul weight held while it ran); the kernels compute the same products either way.
    options.add_session_config_entry("session.disable_prepacking", "1")
    if not _SPINNING.get():
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if weights is None and not protos.is_large(model):
        data = _for_a_session(model).SerializeToString()
        made = ort.InferenceSession(data, options, providers=available(current().providers))
        _MADE_FROM_BYTES[made] = len(data)
        return made
    # Weight-sized temporaries (an LLM's transposed lm_head: 2 GB) are freed as soon as they are read rather
    # than kept by the arena: measured on onnxscript's phi4 model, 3 GB less at the peak.
    options.enable_cpu_mem_arena = False
    # onnxruntime's CPU provider runs a float16 MatMul through Casts it inserts (Cast(W) to float32); in its
    # default order every weight's Cast may run long before its MatMul, holding float32 copies of many weights
    # at once (a 3.5 GB float16 decoder peaked at 6.7 GB, 4.0 GB in priority order). Same ops, same numbers.
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if weights is not None:
        options.add_session_config_entry(_WEIGHTS_FOLDER, str(weights.directory.resolve()))
        return ort.InferenceSession(model.SerializeToString(), options, providers=available(current().providers))
    with tempfile.TemporaryDirectory(prefix="egfuse-validate-", ignore_cleanup_errors=True) as workdir:
        path = protos.save_with_external_data(model, Path(workdir) / "model.onnx")
        return ort.InferenceSession(str(path), options, providers=available(current().providers))


def _for_a_session(model: onnx.ModelProto, *, in_place: bool = False) -> onnx.ModelProto:
    """``model`` without its nodes' ``metadata_props``, which onnxruntime never reads: a dynamo export's source
    map is a third of a model without its weights, and parsing it was 15% of building a session for a 48-layer
    BERT (47 → 41 ms). Everything else stays, ``value_info`` too: a type hint onnxruntime refuses must fail
    validation as it would fail the user's session. ``in_place``: ``model`` is a copy of the caller's own."""
    if not any(node.metadata_props for node in model.graph.node):
        return model
    lean = model if in_place else onnx.ModelProto()
    if lean is not model:
        lean.CopyFrom(model)
    for node in lean.graph.node:
        if node.metadata_props:
            del node.metadata_props[:]
    return lean


_MADE_FROM_BYTES: weakref.WeakKeyDictionary[ort.InferenceSession, int] = weakref.WeakKeyDictionary()
"""A session made from a model's bytes → their size: what :func:`run` decides to keep it by, without protobuf's
``ByteSize``, which walks the whole message again (20 ms for a 15 MB model, as long as serializing it)."""


_SPINNING: ContextVar[bool] = ContextVar("egfuse_spinning", default=True)
"""Whether a session's idle threads spin waiting for work (onnxruntime's default: the fastest runs). Off in
the child that runs the original beside the search (:mod:`egfuse.validation.ahead`), whose spinning threads would
take the core the search runs on; how they wait changes no number."""


@contextmanager
def without_spinning() -> Iterator[None]:
    with _bound(_SPINNING, False):
        yield


_WEIGHTS_FOLDER = "session.model_external_initializers_file_folder_path"
"""onnxruntime's option for a model given as bytes: the folder its external data's locations are relative to."""


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the named intermediate values."""
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    present = {o.name for o in extra.graph.output}
    for name in names:
        if name not in present:
            extra.graph.output.append(onnx.ValueInfoProto(name=name))
    return extra


def run(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    outputs: list[str] | None = None,
    *,
    weights: protos.DetachedWeights | None = None,
) -> dict[str, np.ndarray]:
    early = _PRECOMPUTED.get()
    if early is not None:
        found = early.outputs(model, feeds, outputs or [])
        if found is not None:
            return found
    kept = _KEPT.get()
    key = (id(model), tuple(outputs or ()))
    if kept is not None and key in kept:
        sess = kept[key][1]
    else:
        probe = _for_a_session(with_outputs(model, outputs), in_place=True) if outputs else model
        sess = session(probe, weights)
        size = _MADE_FROM_BYTES.get(sess)  # the model and the outputs asked; None: its weights are in files
        if kept is not None and size is not None and size <= KEEP_BYTES:
            kept[key] = (model, sess)  # the model held too: its id stays its own while the session is kept
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


KEEP_BYTES = 64 << 20
"""Sessions of models up to this size are kept for the next run of the same model (:func:`kept_sessions`)."""
_KEPT: ContextVar[dict | None] = ContextVar("egfuse_kept_sessions", default=None)


@contextmanager
def kept_sessions() -> Iterator[None]:
    """Inside the block, a small model run again (the original and the fused model on each set of feeds: eight
    runs a validation) reuses its session: building one costs more than running a small model. Weights in
    files and larger models get a session a run, so at most one holds their weights."""
    with _bound(_KEPT, {}):
        yield


@dataclass
class Precomputed:
    """The original model's outputs, computed before the judge asks for them (by a child process:
    :mod:`egfuse.validation.ahead`): on the feeds ``original_outputs`` chose (``data``) and on further feed sets,
    each with the graph's outputs and more named values than any one judge asks for."""

    model: onnx.ModelProto
    feeds: dict | None
    """The feeds the user gave (None: generated), as ``original_outputs`` was called with them."""
    data: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    more: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]

    def outputs(self, model: onnx.ModelProto, feeds: dict, names: list[str]) -> dict[str, np.ndarray] | None:
        """What :func:`run` would return for ``model`` on ``feeds`` with ``names`` — the graph's outputs, then the
        names not among them, in that order — or None where this was not computed (another model, other feeds,
        a name not run)."""
        if model is not self.model:
            return None
        for data, outputs in ((self.data, self.expected), *self.more):
            if _same_feeds(data, feeds):
                graph = [o.name for o in model.graph.output]
                wanted = [*graph, *(n for n in dict.fromkeys(names) if n not in graph)]
                if all(name in outputs for name in wanted):
                    return {name: outputs[name] for name in wanted}
                return None
        return None


def _same_feeds(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    if a is b:
        return True
    if a.keys() != b.keys():
        return False
    for name, value in a.items():
        x, y = np.asarray(value), np.asarray(b[name])
        if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            return False
    return True


_PRECOMPUTED: ContextVar[Precomputed | None] = ContextVar("egfuse_precomputed", default=None)


@contextmanager
def precomputed(early: Precomputed | None) -> Iterator[None]:
    """Inside the block, runs of ``early.model`` it holds are read from it instead of run again."""
    with _bound(_PRECOMPUTED, early):
        yield


def original_outputs(
    original: onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None,
    names: list[str],
    *,
    weights: protos.DetachedWeights | None = None,
    budget: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The feeds validation uses and the original's outputs on them. The user's feeds are used as they are
    (never another binding: the user said what the model runs on); generated feeds are tried with dims bound
    independently, then longer ones (:func:`long_dims`: a speech front end), then the related bindings
    (:func:`related_bindings`: a cache's lengths) — the first the original runs on within the memory ``budget``
    is kept. Raises the first failure when none runs (:class:`~egfuse.validation.memory.OverBudget` where that was the
    memory)."""
    early = _PRECOMPUTED.get()
    if early is not None and early.model is original and early.feeds is feeds:
        found = early.outputs(original, early.data, names)
        if found is not None:
            return early.data, found
    mapped = weights is not None

    def attempt(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        memory.check(original, data, budget, weights_mapped=mapped)
        return run(original, data, names, weights=weights)

    if feeds is not None:
        return feeds, attempt(feeds)
    data = make_feeds(original)
    try:
        return data, attempt(data)
    except Exception as first:
        for dims in [long_dims(original, 80), *related_bindings(original)]:
            data = make_feeds(original, dims=dims)
            try:
                return data, attempt(data)
            except Exception:  # the next binding is tried; the first error is the one reported
                continue
        raise first
