"""The Keras producers corpus: tiny random-weight Keras 3 models (TensorFlow backend) exported to ONNX two ways.

egfuse was built on graphs that torch's exporters write; Keras users reach ONNX through TensorFlow, whose graphs
spell attention differently (Einsum lowered to MatMul + Reshape/Transpose chains, ``ops.dot_product_attention``,
masks as ``Select``/``Where`` or added large negatives). This corpus measures how much of that egfuse fuses. Every
model goes through two routes:

- ``keras_tf2onnx``: plain ``tf2onnx.convert.from_keras`` (opset 17); a model that API cannot trace is converted
  from a ``tf.function`` with ``tf2onnx.convert.from_function`` and the row's note says so.
- ``keras_export``: Keras' own ``model.export(path, format="onnx", opset_version=17)`` (it, too, drives tf2onnx on
  the TensorFlow backend, after patching tf2onnx for numpy 2 and with its own tracing of the model).

Models: hand-written ``keras.layers.MultiHeadAttention`` graphs (input (2, 7, 32), 4 heads, key_dim 8: no mask, a
(B, S) padding mask broadcast in the model, a (B, T, S) mask input, an ``Embedding(mask_zero=True)`` implicit mask,
``use_causal_mask``, cross-attention, MHA with dropout — Keras then takes its explicit softmax path instead of
``ops.dot_product_attention`` —, a 2-layer encoder) and keras-hub backbones built from configs with random weights
(hidden 32, 4 heads, 2 layers, vocabulary 99; nothing is downloaded). ``blocks`` is counted from the framework: the
number of attention-layer calls (the innermost layers whose class name holds "Attention") in one eager forward.

Each export runs in a child process (``--child``) with a timeout; a failure, a crash, a hang or an export that
disagrees with Keras' own output by more than 1e-4 on onnxruntime (CPU) is a manifest row with ``file: null`` and
the reason. ``manifest.json`` is written last, per producer directory.

Environment (its own venv: never the project's; these pins are the newest that work together on Python 3.11 —
tf2onnx 1.17 runs on numpy 2 and protobuf 7 here):

    python3.11 -m venv /work/venvs/keras
    /work/venvs/keras/bin/pip install tensorflow-cpu==2.21.0 tensorflow==2.21.0 keras==3.15.1 keras-hub==0.32.0 \\
        tensorflow-text==2.21.1 tf2onnx==1.17.0 onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6 protobuf==7.36.2 \\
        ml_dtypes==0.6.0
    /work/venvs/keras/bin/python experiments/producers_keras.py                  # both producers, every model
    /work/venvs/keras/bin/python experiments/producers_keras.py --only mha_nomask bert_backbone

(keras-hub requires tensorflow-text, which pulls the full ``tensorflow`` wheel beside ``tensorflow-cpu``.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "producers"
ROUTES = {"keras_tf2onnx": "tf2onnx", "keras_export": "keras_export"}  # producer directory → exporter name
OPSET = 17
HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB, INTER, GATED_INTER = 32, 4, 2, 2, 99, 64, 37
BATCH, SEQ, KV_SEQ, MAX_POS = 2, 7, 5, 16
TOLERANCE = 1e-4
TIMEOUT = 300
PACKAGES = ["tensorflow", "tensorflow-cpu", "keras", "keras-hub", "tf2onnx", "onnx", "onnxruntime", "numpy",
            "protobuf"]  # fmt: skip


@dataclass
class Spec:
    """One model: how to build it (a Keras model and its feeds keyed by model input name) and what it holds."""

    name: str
    build: Callable[[], tuple[Any, dict[str, np.ndarray]]]
    flavour: list[str]
    heads: int = HEADS
    kv_heads: int = HEADS
    head_dim: int = HIDDEN // HEADS


@dataclass
class Entry:
    """A manifest row (the drift corpus' format plus ``note`` and ``framework_max_abs_diff``)."""

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
    note: str | None = None
    framework_max_abs_diff: float | None = None


# ---------------------------------------------------------------------------------------------------------------
# Feeds


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _padding(batch: int = BATCH, seq: int = SEQ, dtype: str = "int32") -> np.ndarray:
    """Ones, with the last sequence's last two positions masked (0)."""
    mask = np.ones((batch, seq), dtype)
    mask[-1, -2:] = 0
    return mask


def _ids(seq: int = SEQ, seed: int = 0) -> np.ndarray:
    return _rng(seed).integers(3, VOCAB, (BATCH, seq)).astype("int32")


def _hidden(seq: int = SEQ, seed: int = 0) -> np.ndarray:
    return _rng(seed).standard_normal((BATCH, seq, HIDDEN)).astype("float32")


# ---------------------------------------------------------------------------------------------------------------
# Hand-written MultiHeadAttention models


def _mha(**kwargs: Any) -> Any:
    import keras

    return keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=HIDDEN // HEADS, **kwargs)


def _pad_to_square(mask: Any, query_len: int) -> Any:
    """(B, S) padding mask → (B, T, S) boolean attention mask, inside the model (what Keras users write)."""
    from keras import ops

    mask = ops.expand_dims(ops.cast(mask, "bool"), 1)
    return ops.repeat(mask, query_len, axis=1)


def mha_nomask() -> tuple[Any, dict]:
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    return keras.Model(x, _mha()(x, x)), {"x": _hidden()}


def mha_padmask() -> tuple[Any, dict]:
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    mask = keras.Input((SEQ,), dtype="bool", name="padding_mask")
    out = _mha()(x, x, attention_mask=_pad_to_square(mask, SEQ))
    return keras.Model([x, mask], out), {"x": _hidden(), "padding_mask": _padding(dtype="bool")}


def mha_mask3d() -> tuple[Any, dict]:
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    mask = keras.Input((SEQ, SEQ), dtype="int32", name="attention_mask")
    square = np.repeat(_padding()[:, None, :], SEQ, axis=1)
    return keras.Model([x, mask], _mha()(x, x, attention_mask=mask)), {"x": _hidden(), "attention_mask": square}


def mha_embmask() -> tuple[Any, dict]:
    """Keras' implicit masking: Embedding(mask_zero=True) hands its mask to MHA as query and value masks."""
    import keras

    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    h = keras.layers.Embedding(VOCAB, HIDDEN, mask_zero=True)(ids)
    feeds = _ids()
    feeds[-1, -2:] = 0
    return keras.Model(ids, _mha()(h, h)), {"token_ids": feeds}


def mha_causal() -> tuple[Any, dict]:
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    return keras.Model(x, _mha()(x, x, use_causal_mask=True)), {"x": _hidden()}


def mha_cross() -> tuple[Any, dict]:
    import keras

    q = keras.Input((SEQ, HIDDEN), name="query")
    kv = keras.Input((KV_SEQ, HIDDEN), name="context")
    return keras.Model([q, kv], _mha()(q, kv)), {"query": _hidden(), "context": _hidden(KV_SEQ, seed=1)}


def mha_dropout_padmask() -> tuple[Any, dict]:
    """dropout > 0 makes Keras skip ``ops.dot_product_attention``: explicit Einsum → masked Softmax → Einsum."""
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    mask = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    out = _mha(dropout=0.1)(x, x, attention_mask=_pad_to_square(mask, SEQ))
    return keras.Model([x, mask], out), {"x": _hidden(), "padding_mask": _padding()}


def encoder2_padmask() -> tuple[Any, dict]:
    """Two post-LN transformer encoder layers: MHA + residual + LayerNorm + Dense-gelu FFN + residual + LayerNorm."""
    import keras

    x = keras.Input((SEQ, HIDDEN), name="x")
    mask = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    square, h = _pad_to_square(mask, SEQ), x
    for _ in range(LAYERS):
        h = keras.layers.LayerNormalization()(h + _mha()(h, h, attention_mask=square))
        ffn = keras.layers.Dense(HIDDEN)(keras.layers.Dense(INTER, activation="gelu")(h))
        h = keras.layers.LayerNormalization()(h + ffn)
    return keras.Model([x, mask], h), {"x": _hidden(), "padding_mask": _padding()}


# ---------------------------------------------------------------------------------------------------------------
# keras-hub backbones


def _hub(cls: str, feeds: Callable[[], dict[str, np.ndarray]], **sizes: Any) -> Callable[[], tuple[Any, dict]]:
    def build() -> tuple[Any, dict]:
        import keras_hub

        return getattr(keras_hub.models, cls)(**sizes), feeds()

    build.__name__ = cls
    return build


def _text() -> dict[str, np.ndarray]:
    return {"token_ids": _ids(), "padding_mask": _padding()}


def _text_segments() -> dict[str, np.ndarray]:
    return {**_text(), "segment_ids": np.zeros((BATCH, SEQ), "int32")}


def _seq2seq() -> dict[str, np.ndarray]:
    return {"encoder_token_ids": _ids(), "encoder_padding_mask": _padding(),
            "decoder_token_ids": _ids(KV_SEQ, seed=1), "decoder_padding_mask": _padding(seq=KV_SEQ)}  # fmt: skip


def _image() -> dict[str, np.ndarray]:
    return {"images": _rng().standard_normal((BATCH, 32, 32, 3)).astype("float32")}


def _whisper() -> dict[str, np.ndarray]:
    return {"encoder_features": _rng().standard_normal((BATCH, 32, 8)).astype("float32"),
            "decoder_token_ids": _ids(KV_SEQ, seed=1), "decoder_padding_mask": _padding(seq=KV_SEQ)}  # fmt: skip


ENC = {"vocabulary_size": VOCAB, "num_layers": LAYERS, "num_heads": HEADS, "hidden_dim": HIDDEN,
       "intermediate_dim": INTER}  # fmt: skip
DEC = {"vocabulary_size": VOCAB, "num_layers": LAYERS, "num_query_heads": HEADS, "num_key_value_heads": KV_HEADS,
       "hidden_dim": HIDDEN, "intermediate_dim": GATED_INTER}  # fmt: skip
VIS = {"image_shape": (32, 32, 3), "patch_size": 8, "num_layers": LAYERS, "num_heads": HEADS, "hidden_dim": HIDDEN}

SPECS: list[Spec] = [
    Spec("mha_nomask", mha_nomask, ["mha"]),
    Spec("mha_padmask", mha_padmask, ["mha", "padding mask", "bool mask"]),
    Spec("mha_mask3d", mha_mask3d, ["mha", "padding mask", "3d mask input"]),
    Spec("mha_embmask", mha_embmask, ["mha", "padding mask", "keras implicit mask"]),
    Spec("mha_causal", mha_causal, ["mha", "causal"]),
    Spec("mha_cross", mha_cross, ["cross-attention"]),
    Spec("mha_dropout_padmask", mha_dropout_padmask, ["mha", "padding mask", "explicit softmax path"]),
    Spec("encoder2_padmask", encoder2_padmask, ["mha", "padding mask"]),
    Spec("bert_backbone", _hub("BertBackbone", _text_segments, **ENC, max_sequence_length=MAX_POS),
         ["mha", "padding mask"]),
    Spec("roberta_backbone", _hub("RobertaBackbone", _text, **ENC, max_sequence_length=MAX_POS),
         ["mha", "padding mask"]),
    Spec("distil_bert_backbone", _hub("DistilBertBackbone", _text, **ENC, max_sequence_length=MAX_POS),
         ["mha", "padding mask"]),
    Spec("gpt2_backbone", _hub("GPT2Backbone", _text, **ENC, max_sequence_length=MAX_POS),
         ["mha", "causal", "padding mask"]),
    Spec("opt_backbone", _hub("OPTBackbone", _text, **ENC, max_sequence_length=MAX_POS),
         ["mha", "causal", "padding mask"]),
    Spec("gpt_neo_x_backbone", _hub("GPTNeoXBackbone", _text, **ENC, max_sequence_length=MAX_POS),
         ["mha", "causal", "padding mask", "rope"]),
    Spec("falcon_backbone", _hub("FalconBackbone", _text, vocabulary_size=VOCAB, num_layers=LAYERS,
                                 num_attention_heads=HEADS, hidden_dim=HIDDEN, intermediate_dim=INTER),
         ["mha", "causal", "padding mask", "alibi"]),
    Spec("llama_backbone", _hub("LlamaBackbone", _text, **DEC), ["gqa", "causal", "padding mask", "rope"],
         kv_heads=KV_HEADS),
    Spec("mistral_backbone", _hub("MistralBackbone", _text, **DEC, sliding_window=MAX_POS),
         ["gqa", "causal", "padding mask", "rope", "sliding window"], kv_heads=KV_HEADS),
    Spec("qwen_backbone", _hub("QwenBackbone", _text, **DEC), ["gqa", "causal", "padding mask", "rope"],
         kv_heads=KV_HEADS),
    Spec("phi3_backbone", _hub("Phi3Backbone", _text, **DEC, max_sequence_length=MAX_POS),
         ["gqa", "causal", "padding mask", "rope"], kv_heads=KV_HEADS),
    Spec("gemma_backbone", _hub("GemmaBackbone", _text, **DEC, head_dim=HIDDEN // HEADS),
         ["gqa", "causal", "padding mask", "rope"], kv_heads=KV_HEADS),
    Spec("gemma3_backbone", _hub("Gemma3Backbone", _text, **DEC, head_dim=HIDDEN // HEADS, image_size=32,
                                 use_query_key_norm=True, use_sliding_window_attention=True, sliding_window_size=4),
         ["gqa", "causal", "padding mask", "rope", "qk norm", "sliding window"], kv_heads=KV_HEADS),
    Spec("qwen3_backbone", _hub("Qwen3Backbone", _text, **DEC, head_dim=HIDDEN // HEADS),
         ["gqa", "causal", "padding mask", "rope", "qk norm"], kv_heads=KV_HEADS),
    Spec("albert_backbone", _hub("AlbertBackbone", _text_segments, **ENC, embedding_dim=16,
                                 max_sequence_length=MAX_POS), ["mha", "padding mask", "shared layers"]),
    Spec("vit_backbone", _hub("ViTBackbone", _image, **VIS, mlp_dim=INTER), ["mha", "vision"]),
    Spec("deit_backbone", _hub("DeiTBackbone", _image, **VIS, intermediate_dim=INTER), ["mha", "vision"]),
    Spec("whisper_backbone", _hub("WhisperBackbone", _whisper, **ENC, num_mels=8, max_encoder_sequence_length=32,
                                  max_decoder_sequence_length=MAX_POS),
         ["mha", "causal", "padding mask", "cross-attention", "speech"]),
    Spec("bart_backbone", _hub("BartBackbone", _seq2seq, **ENC, max_sequence_length=MAX_POS),
         ["mha", "causal", "padding mask", "cross-attention"]),
    Spec("t5_backbone", _hub("T5Backbone", _seq2seq, **ENC), ["mha", "causal", "padding mask", "cross-attention",
                                                              "relative bias", "unscaled"]),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The child: build, count, export, check


def count_attention_calls(model: Any, feeds: dict[str, np.ndarray]) -> tuple[int, Any]:
    """(attention-layer calls in one eager forward, the outputs). The innermost attention layers are those whose
    class name holds "Attention" and that hold no such layer; their classes' ``call`` is wrapped for one forward
    (a subclass calling ``super().call`` counts once)."""
    layers = list(model._flatten_layers(include_self=False, recursive=True))

    def is_attention(layer: Any) -> bool:
        return "attention" in type(layer).__name__.lower()

    leaves = [la for la in layers if is_attention(la) and not any(
        is_attention(s) for s in la._flatten_layers(include_self=False, recursive=True))]  # fmt: skip
    classes = {type(la) for la in leaves}
    state = {"calls": 0, "depth": 0}
    saved: dict[type, Any] = {}
    for cls in classes:
        original = cls.call  # maybe inherited: then the wrapper is deleted again afterwards
        saved[cls] = cls.__dict__.get("call")

        def counting(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            state["depth"] += 1
            if state["depth"] == 1:
                state["calls"] += 1
            try:
                return __original(self, *args, **kwargs)
            finally:
                state["depth"] -= 1

        cls.call = counting
    try:
        outputs = model(_model_feeds(model, feeds), training=False)
    finally:
        for cls, own in saved.items():
            if own is None:
                del cls.call
            else:
                cls.call = own
    return state["calls"], outputs


def _model_feeds(model: Any, feeds: dict[str, np.ndarray]) -> Any:
    """Feeds in the structure the model takes (a dict for keras-hub backbones, a list or one array otherwise)."""
    if isinstance(model._inputs_struct, dict):
        return dict(feeds)
    if len(model.inputs) == 1:
        return next(iter(feeds.values()))
    return [feeds[t.name] for t in model.inputs]


def _flatten_outputs(outputs: Any) -> dict[str, np.ndarray]:
    """Outputs by name, in ``keras.tree.flatten`` order (sorted keys): the order of ``model.outputs``, which
    tf2onnx's from_keras follows while naming them after layers."""
    if isinstance(outputs, dict):
        return {k: np.asarray(outputs[k]) for k in sorted(outputs)}
    if isinstance(outputs, list | tuple):
        return {f"output_{i}": np.asarray(v) for i, v in enumerate(outputs)}
    return {"output_0": np.asarray(outputs)}


def _signature(model: Any, feeds: dict[str, np.ndarray]) -> Any:
    """TensorSpecs of the model's own input shapes (dynamic batch; dynamic sequence where the model has one, as
    ``model.export`` uses), named as the feeds. Not all-dynamic: a Conv whose channel count is unknown is run by
    Keras under ``tf.function(jit_compile=True)``, a call tf2onnx cannot convert."""
    import tensorflow as tf

    def spec(name: str, tensor: Any) -> Any:
        return tf.TensorSpec(tensor.shape, tf.as_dtype(feeds[name].dtype), name=name)

    if isinstance(model._inputs_struct, dict):
        return [{name: spec(name, t) for name, t in model._inputs_struct.items()}]
    if len(model.inputs) == 1:
        return [spec(next(iter(feeds)), model.inputs[0])]
    return [spec(t.name, t) for t in model.inputs]


def export_tf2onnx(model: Any, feeds: dict[str, np.ndarray], path: Path) -> str | None:
    """``tf2onnx.convert.from_keras``; when that API cannot trace the model, ``from_function`` on a tf.function."""
    import tensorflow as tf
    import tf2onnx

    signature = _signature(model, feeds)
    try:
        tf2onnx.convert.from_keras(model, input_signature=signature, opset=OPSET, output_path=str(path))
        _loads(path)
        return None
    except Exception as err:  # any failure of from_keras is reported in the row's note
        first = f"from_keras failed ({_first_line(err)[:160]}); converted with from_function"
    if isinstance(model._inputs_struct, dict) or len(signature) == 1:
        function = tf.function(lambda inputs: model(inputs, training=False))
    else:
        function = tf.function(lambda *inputs: model(list(inputs), training=False))
    tf2onnx.convert.from_function(function, input_signature=signature, opset=OPSET, output_path=str(path))
    return first


def _loads(path: Path) -> None:
    """Raise when onnxruntime cannot load the model (tf2onnx leaves ops it cannot convert in the graph)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def register_erfc() -> None:
    """tf2onnx 1.17 has no converter for TensorFlow's ``Erfc``, which ``tf.nn.gelu(approximate=False)`` (Keras 3's
    exact gelu) writes; unconverted, it stays in the graph and onnxruntime refuses the model. Erfc(x) = 1 − Erf(x)
    (ONNX Erf, opset 9): registered here for both routes (tf2onnx's handler registry is global)."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
            node.type = "Sub"
            ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def export_keras(model: Any, feeds: dict[str, np.ndarray], path: Path) -> str | None:
    model.export(str(path), format="onnx", opset_version=OPSET, verbose=False)
    return None


def _has_erfc(path: Path) -> bool:
    import onnx

    return any(n.name.endswith("/Erfc") for n in onnx.load(str(path)).graph.node)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def check(path: Path, feeds: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[float, dict]:
    """Max |onnxruntime − Keras| over the outputs, and the feeds keyed by graph input name and cast to its type."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    types = {"tensor(float)": "float32", "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(bool)": "bool"}
    graph_feeds = {}
    for inp in session.get_inputs():
        key = inp.name.split(":")[0]
        if len(feeds) == len(session.get_inputs()) == 1:
            key = next(iter(feeds))
        if key not in feeds:  # keras export (ExportArchive) leaves captured eager constants as graph inputs
            raise KeyError(f"graph input {inp.name!r} is no model input (model inputs: {sorted(feeds)})")
        graph_feeds[inp.name] = feeds[key].astype(types.get(inp.type, feeds[key].dtype))
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, graph_feeds), strict=True))
    diff = 0.0
    for i, (key, want) in enumerate(reference.items()):
        name = next((n for n in got if n.split(":")[0] == key), None) or list(got)[i]  # from_keras: layer names
        if got[name].shape != want.shape:
            raise ValueError(f"output {name} has shape {got[name].shape}, Keras {want.shape}")
        diff = max(diff, float(np.abs(got[name].astype("float64") - want).max()))
    return diff, graph_feeds


def child(name: str, producer: str, out: Path) -> dict:
    """Build, count, export and check one model; the row as a dict (printed as JSON by ``--child``)."""
    import keras

    spec = next(s for s in SPECS if s.name == name)
    exporter = ROUTES[producer]
    row = Entry(name, exporter, None, 0, spec.flavour, spec.heads, spec.kv_heads, spec.head_dim)
    start = time.perf_counter()
    try:
        keras.utils.set_random_seed(0)
        model, feeds = spec.build()
        row.blocks, outputs = count_attention_calls(model, feeds)
        reference = _flatten_outputs(outputs)
        path = out / f"{name}.{exporter}.onnx"
        register_erfc()
        with contextlib.redirect_stdout(io.StringIO()):
            row.note = (export_tf2onnx if exporter == "tf2onnx" else export_keras)(model, feeds, path)
        diff, graph_feeds = check(path, feeds, reference)
        row.framework_max_abs_diff = diff
        if _has_erfc(path):
            row.note = "; ".join(filter(None, [row.note, "gelu's Erfc converted by register_erfc (tf2onnx has none)"]))
        row.inputs = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in graph_feeds.items()}
        if not diff <= TOLERANCE:
            path.unlink()
            row.error = f"export disagrees with Keras: max abs diff {diff:.3g} > {TOLERANCE:g}"
        else:
            np.savez(out / f"{name}.{exporter}.feeds.npz", **graph_feeds)
            row.file = path.name
    except Exception as err:  # every failure becomes the row's error
        (out / f"{name}.{exporter}.onnx").unlink(missing_ok=True)
        row.error = _first_line(err)
        traceback.print_exc()
    row.export_seconds = round(time.perf_counter() - start, 1)
    return asdict(row)


# ---------------------------------------------------------------------------------------------------------------
# The parent: one child per export, manifests last


def run_child(spec: Spec, producer: str, out: Path, timeout: float) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, __file__, "--child", spec.name, producer, str(out)]
    blank = Entry(spec.name, ROUTES[producer], None, 0, spec.flavour, spec.heads, spec.kv_heads, spec.head_dim)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**asdict(blank), "error": f"timeout after {timeout:.0f}s", "export_seconds": timeout}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return {**asdict(blank), "error": f"crashed (exit {proc.returncode}): {tail[0][:200]}",
                "export_seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    return json.loads(lines[-1][4:])


def versions() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--producers", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--only", nargs="*", help="model names (default: all); a manifest then keeps other rows")
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--child", nargs=3, metavar=("NAME", "PRODUCER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, producer, out = args.child
        print("ROW " + json.dumps(child(name, producer, Path(out))), flush=True)
        return 0
    specs = [s for s in SPECS if not args.only or s.name in args.only]
    for producer in args.producers:
        out = args.out / producer
        out.mkdir(parents=True, exist_ok=True)
        manifest_path = out / "manifest.json"
        old = json.loads(manifest_path.read_text()) if manifest_path.exists() and args.only else {"models": []}
        manifest_path.unlink(missing_ok=True)  # absent while the producer is being rewritten
        start, rows = time.perf_counter(), []
        for spec in specs:
            row = run_child(spec, producer, out, args.timeout)
            rows.append(row)
            status = f"ok diff {row['framework_max_abs_diff']:.1e}" if row["file"] else f"FAILED {row['error']}"
            print(f"{producer:<14} {spec.name:<22} blocks {row['blocks']}  {row['export_seconds']:>5}s  {status}"
                  + (f"  [{row['note']}]" if row["note"] else ""), flush=True)  # fmt: skip
        done = {r["name"] for r in rows}
        order = [s.name for s in SPECS]
        rows = sorted([r for r in old["models"] if r["name"] not in done] + rows, key=lambda r: order.index(r["name"]))
        manifest = {"stack": producer, "producer": f"keras 3 (TensorFlow backend) via {ROUTES[producer]}",
                    "versions": versions(), "python": platform.python_version(), "opset": OPSET, "hidden": HIDDEN,
                    "heads": HEADS, "kv_heads": KV_HEADS, "layers": LAYERS,
                    "export_seconds": round(time.perf_counter() - start + (old.get("export_seconds") or 0), 1),
                    "models": rows}  # fmt: skip
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
