"""The timm and open_clip producers corpus: vision attention as those libraries write it, exported by both exporters.

The drift corpus covers transformers; most vision models in the wild come from timm (and CLIP towers from
open_clip), whose attention modules are their own code: windowed (Swin), cosine with a logit scale (SwinV2),
rotary (EVA), class attention and talking heads (CaiT), relative position bias (BEiT), block + grid partitions
(MaxViT), spatial reduction (PVTv2, Twins), attention bias (LeViT), factorized attention (CoaT), cross-covariance
attention (XCiT). Each is built by ``timm.create_model(name, pretrained=False, **sizes)`` (MaxViT from its own
config class) with tiny random weights — nothing is downloaded — and exported with both torch exporters
(``torch.onnx.export(dynamo=False)`` at opset 17 → ``torchscript``; ``dynamo=True`` at opset 18 → ``dynamo``),
once with timm's fused attention on (``F.scaled_dot_product_attention``, suffix ``_fused``) and once off (the
explicit ``q @ k.T → softmax → @ v`` code, suffix ``_eager``). timm reads its switch when a module is built
(``self.fused_attn = use_fused_attn()``), so ``timm.layers.set_fused_attn`` before ``create_model`` is what works
(the ``TIMM_FUSED_ATTN`` variable is read once, at import). ``set_fused_attn(True, experimental=True)`` is used
because Swin's and XCiT's fused paths are behind timm's "experimental" level. An architecture whose attention
modules have no fused path at all (SwinV2, LeViT, CoaT, CaiT's talking heads …) gets only its ``_eager`` model:
the ``_fused`` one would be the same graph.

``blocks`` is counted from the framework: forward hooks on timm's attention classes (class names with
``Attention``/``Attn``/``XCA``, not the blocks and partition wrappers around them) count the attention modules
executed on the feeds. Every export is run on onnxruntime (CPU) with the stored feeds and compared with the torch
output (``framework_max_abs_diff``); a failure or a disagreement above 1e-4 is a row with ``file: null`` and the
reason. Each export runs in a forked child with a timeout. ``manifest.json`` is written last.

Environment (its own venv: timm needs torchvision, which does not import beside the main venv's torch)::

    python3.11 -m venv /work/venvs/timm && . /work/venvs/timm/bin/activate
    pip install torch==2.14.1 torchvision==0.29.1
    pip install timm==1.0.31 open_clip_torch==3.3.0 onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2 numpy==2.4.6
    python experiments/producers_timm.py                         # both producers
    python experiments/producers_timm.py --producers timm --only swin eva   # re-export some architectures
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import drift_corpus  # stdlib and numpy at import: the exporter helpers shared with the drift corpus

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "data" / "producers"
BATCH, TIMEOUT, TOLERANCE = 2, 300, 1e-4
PACKAGES = ("timm", "open_clip_torch", "torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "numpy")
ATTENTION_CLASS = re.compile(r"(Attention|Attn|^XCA$)")
NOT_ATTENTION = re.compile(r"(Block|Partition|Parallel|Pool|Stage)")
"""An attention module is one whose class name says so; the blocks, partition wrappers and pools around one are
not (they would count it twice)."""


@dataclass
class Spec:
    name: str  # architecture, without the attention implementation
    build: Callable[[], Any]  # the torch module (random weights); wrapped so that it returns tensors only
    feeds: Callable[[], dict[str, np.ndarray]]
    flavour: list[str]
    heads: int = 4
    head_dim: int = 8
    producer: str = "timm"
    impls: tuple[str, ...] = ("fused", "eager")  # narrowed to ("eager",) where no module has a fused path
    # Hooks for other producers (experiments/producers_diffusers.py); None keeps timm's and open_clip's behaviour:
    configure: Callable[[Any, str], None] | None = None  # called with the built model and the implementation
    modules: Callable[[Any], list] | None = None  # the attention modules to count (default: by class name)
    batched: tuple[str, ...] | None = None  # the inputs with a batch axis (default: all)
    outputs: tuple[str, ...] | None = None  # output names (default: last_hidden_state, or pooled + it)
    rewrite: Callable[[Path, str], None] | None = None  # on each exported file and its exporter, before the check


@dataclass
class Entry(drift_corpus.Entry):
    """A drift-corpus manifest row, plus the check against the framework."""

    framework_max_abs_diff: float | None = None
    attention_modules: dict[str, int] = field(default_factory=dict)  # class → calls, from the forward hooks


def _pixels(size: int) -> Callable[[], dict[str, np.ndarray]]:
    def feeds() -> dict[str, np.ndarray]:
        return {"pixel_values": np.random.default_rng(0).standard_normal((BATCH, 3, size, size)).astype(np.float32)}

    return feeds


def _text() -> dict[str, np.ndarray]:
    """Token ids for a causal text tower; the largest id of each row is its end token (open_clip pools at argmax)."""
    ids = np.random.default_rng(0).integers(3, 90, (BATCH, 7)).astype(np.int64)
    ids[0, 4], ids[1, 6] = 98, 98
    return {"input_ids": ids}


# ---------------------------------------------------------------------------------------------------------------
# Models


def _features(model):
    """timm models → their unpooled features (every token of the last block reaches the output, so a wrong fusion
    of any row shows in the check)."""
    import torch

    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model.forward_features(pixel_values)

    return Features()


def _timm(name: str, **sizes: Any) -> Callable[[], Any]:
    def build():
        import timm

        return _features(timm.create_model(name, pretrained=False, num_classes=0, **sizes))

    return build


def _maxvit() -> Any:
    """MaxViT from its config class (``create_model`` passes its own ``model_cfg``): two stages of one MaxViT block
    (MBConv, then window 'block' attention, then dilated 'grid' attention), windows 2×2 on 8×8 and 4×4 maps."""
    from timm.models.maxxvit import MaxxVit, MaxxVitCfg, MaxxVitConvCfg, MaxxVitTransformerCfg

    cfg = MaxxVitCfg(
        embed_dim=(16, 32),
        depths=(1, 1),
        block_type=("M", "M"),
        stem_width=(8, 16),
        conv_cfg=MaxxVitConvCfg(expand_ratio=2.0),
        transformer_cfg=MaxxVitTransformerCfg(dim_head=8, window_size=(2, 2), expand_ratio=2.0),
    )
    return _features(MaxxVit(cfg, img_size=32, num_classes=0))


VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0}
HIER = {"embed_dims": (16, 32), "depths": (2, 2), "num_heads": (2, 4), "mlp_ratios": (2, 2)}
SWIN = {"img_size": 32, "embed_dim": 16, "depths": (2, 2), "num_heads": (2, 4), "window_size": 2, "mlp_ratio": 2.0}
VISION = ["mha", "vision"]

TIMM_SPECS: list[Spec] = [
    Spec("vit", _timm("vit_tiny_patch16_224", **VIT), _pixels(32), VISION),
    Spec("deit", _timm("deit_tiny_distilled_patch16_224", **VIT), _pixels(32), [*VISION, "distillation token"]),
    Spec("vit_relpos", _timm("vit_relpos_small_patch16_224", **VIT), _pixels(32), [*VISION, "attention bias"]),
    Spec("beit", _timm("beit_base_patch16_224", **VIT), _pixels(32), [*VISION, "attention bias"]),
    Spec("eva", _timm("eva02_tiny_patch14_224", **VIT, ref_feat_shape=(4, 4)), _pixels(32), [*VISION, "rope"]),
    Spec("cait", _timm("cait_xxs24_224", **VIT, depth_token_only=1), _pixels(32),
         [*VISION, "talking heads", "class attention"]),
    Spec("xcit", _timm("xcit_nano_12_p8_224", **{k: v for k, v in VIT.items() if k != "mlp_ratio"},
                       cls_attn_layers=1), _pixels(32), [*VISION, "cross-covariance attention", "class attention"]),
    Spec("swin", _timm("swin_tiny_patch4_window7_224", **SWIN), _pixels(32),
         [*VISION, "window attention", "shifted window mask", "attention bias"]),
    Spec("swinv2", _timm("swinv2_tiny_window8_256", **SWIN), _pixels(32),
         [*VISION, "window attention", "shifted window mask", "cosine attention", "attention bias"]),
    Spec("maxvit", _maxvit, _pixels(32), [*VISION, "window attention", "grid attention", "attention bias"]),
    Spec("pvt_v2", _timm("pvt_v2_b0", **{**HIER, "depths": (1, 1)}, sr_ratios=(2, 1)), _pixels(32),
         [*VISION, "spatial reduction"]),
    Spec("twins", _timm("twins_svt_small", img_size=32, **HIER, sr_ratios=(2, 1), wss=(2, 2)), _pixels(32),
         [*VISION, "window attention", "spatial reduction"]),
    Spec("levit", _timm("levit_128s", img_size=64, embed_dim=(32, 48), key_dim=8, depth=(1, 1), num_heads=(4, 6),
                        mlp_ratio=2.0, attn_ratio=2.0), _pixels(64), [*VISION, "attention bias", "conv projections"]),
    Spec("coat", _timm("coat_lite_tiny", img_size=32, embed_dims=(32, 32, 32, 32), serial_depths=(1, 1, 1, 1),
                       num_heads=4, mlp_ratios=(2, 2, 2, 2), crpe_window={3: 4}), _pixels(32),
         [*VISION, "factorized attention", "conv relative position"]),
]  # fmt: skip


def _clip(tower: str, block_type: str) -> Callable[[], Any]:
    """A tiny open_clip CLIP from config dataclasses: the image tower (a ViT, its tokens and pooled embedding) or
    the text tower (causal mask, argmax pooling). ``block_type`` 'default' = ``nn.MultiheadAttention``,
    'custom' = open_clip's own ``Attention`` (``F.scaled_dot_product_attention``)."""

    def build():
        import open_clip
        import torch
        from open_clip.model import CLIPTextCfg, CLIPVisionCfg

        vision = CLIPVisionCfg(layers=2, width=32, head_width=8, mlp_ratio=2.0, patch_size=8, image_size=32,
                               output_tokens=True, block_type=block_type)  # fmt: skip
        text = CLIPTextCfg(context_length=7, vocab_size=99, width=32, heads=4, layers=2, mlp_ratio=2.0,
                           output_tokens=True, block_type=block_type)  # fmt: skip
        model = open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text)

        class Tower(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model.visual if tower == "image" else model

            def forward(self, x):
                if tower == "image":
                    return self.model(x)  # (pooled, tokens): output_tokens
                return _encode_text(self.model, x)

        return Tower()

    return build


def _encode_text(model, ids):
    """``CLIP.encode_text`` returning the tokens as well (a CLIP keeps its text tower's parts on itself, and
    ``encode_text`` gives only the pooled embedding, where just one row of the last block reaches the output)."""
    import torch
    from open_clip.transformer import text_global_pool

    x = model.token_embedding(ids) + model.positional_embedding
    x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask))
    pooled = text_global_pool(x, ids, model.text_pool_type)
    projection = model.text_projection
    return (projection(pooled) if isinstance(projection, torch.nn.Module) else pooled @ projection), x


CLIP_SPECS: list[Spec] = [
    Spec(f"clip_{tower}_{impl}", _clip(tower, block_type), _pixels(32) if tower == "image" else _text,
         VISION if tower == "image" else ["mha", "causal", "text"],
         producer="open_clip", impls=("",))
    for tower in ("image", "text") for impl, block_type in (("mha", "default"), ("custom", "custom"))
]  # fmt: skip
SPECS = {"timm": TIMM_SPECS, "open_clip": CLIP_SPECS}


# ---------------------------------------------------------------------------------------------------------------
# Export (runs in a forked child)


def _set_fused(impl: str) -> None:
    import timm.layers

    timm.layers.set_fused_attn(impl != "eager", experimental=impl != "eager")


def _attention_modules(model) -> list:
    return [m for m in model.modules() if ATTENTION_CLASS.search(type(m).__name__)
            and not NOT_ATTENTION.search(type(m).__name__)]  # fmt: skip


def has_fused_path(spec: Spec) -> bool:
    """Whether any attention module of the architecture takes timm's fused path when it is switched on."""
    _set_fused("fused")
    model = spec.build()
    return any(getattr(m, "fused_attn", False) for m in model.modules())


def _run_framework(model, args: tuple, modules: Callable[[Any], list] | None = None
                   ) -> tuple[list[np.ndarray], dict[str, int]]:  # fmt: skip
    """The model's outputs on the feeds, and how often each attention class ran (forward hooks on ``modules(model)``,
    by default :func:`_attention_modules`)."""
    import torch

    calls: Counter[str] = Counter()
    handles = [m.register_forward_hook(lambda mod, i, o: calls.update([type(mod).__name__]))
               for m in (modules or _attention_modules)(model)]  # fmt: skip
    try:
        with torch.no_grad():
            out = model(*args)
    finally:
        for h in handles:
            h.remove()
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o.detach().numpy() for o in outs], dict(calls)


def _ort_outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _export_dynamo(model, args: tuple, names: list[str], outputs: list[str], path: Path,
                   batched: tuple[str, ...] | None = None) -> str | None:  # fmt: skip
    """``torch.onnx.export(dynamo=True)`` at opset 18 with a dynamic batch (on the ``batched`` inputs, default all);
    static shapes when that fails (noted)."""
    import torch

    common = {
        "input_names": names,
        "output_names": outputs,
        "dynamo": True,
        "opset_version": 18,
        "external_data": False,
    }  # one file per model, as the corpus format has it
    batch = torch.export.Dim("batch", min=1, max=64)
    try:
        shapes = tuple({0: batch} if batched is None or n in batched else None for n in names)
        torch.onnx.export(model, args, str(path), dynamic_shapes=shapes, **common)
        return None
    except Exception as err:  # retried without dynamic shapes, reason noted
        first = drift_corpus._reason(err)
    torch.onnx.export(model, args, str(path), **common)
    return f"static shapes (dynamic failed: {first})"


def export(spec: Spec, impl: str, exporter: str, out_dir: Path) -> Entry:
    import torch

    name = f"{spec.name}_{impl}" if impl else spec.name
    entry = Entry(name, exporter, None, 0, spec.flavour, spec.heads, spec.heads, spec.head_dim)
    start = time.perf_counter()
    path = out_dir / f"{name}.{exporter}.onnx"
    try:
        if spec.producer == "timm":
            _set_fused(impl)
        torch.manual_seed(0)
        model = spec.build().eval()
        if spec.configure:
            spec.configure(model, impl)
        feeds = spec.feeds()
        names = list(feeds)
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        expected, calls = _run_framework(model, args, spec.modules)
        entry.blocks, entry.attention_modules = sum(calls.values()), calls
        outputs = ["last_hidden_state"] if len(expected) == 1 else ["pooled", "last_hidden_state"]
        outputs = list(spec.outputs) if spec.outputs else outputs
        axes = {n: {0: "batch"} for n in names if spec.batched is None or n in spec.batched}
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), drift_corpus._quiet_fds():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                torch.onnx.export(model, args, str(path), input_names=names, output_names=outputs,
                                  dynamic_axes=axes, opset_version=17, dynamo=False)  # fmt: skip
            else:
                entry.note = _export_dynamo(model, args, names, outputs, path, spec.batched)
        if spec.rewrite:
            spec.rewrite(path, exporter)
        feeds = drift_corpus._keyed_by_graph_inputs(path, feeds)
        got = _ort_outputs(path, feeds)
        if len(got) != len(expected):
            raise ValueError(f"the export has {len(got)} outputs, the model {len(expected)}")
        diff = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected, strict=True))
        entry.framework_max_abs_diff = diff
        if not diff <= TOLERANCE:
            raise ValueError(f"onnxruntime disagrees with {spec.producer}: max abs diff {diff:.3g} > {TOLERANCE:g}")
        size = path.stat().st_size
        if size > 300_000:
            entry.note = "; ".join(filter(None, [entry.note, f"{size // 1000} KB"]))
        entry.file = path.name
        entry.inputs = {n: {"shape": list(v.shape), "dtype": str(v.dtype)} for n, v in feeds.items()}
        np.savez(out_dir / f"{name}.{exporter}.feeds.npz", **feeds)
    except Exception as err:
        entry.error = drift_corpus._reason(err)
        traceback.print_exc(limit=3, file=sys.stderr)
        path.unlink(missing_ok=True)
    entry.export_seconds = round(time.perf_counter() - start, 2)
    return entry


def _run_forked(job: Callable[[], Entry], fallback: Entry, timeout: float) -> Entry:
    """One export in a forked child (torch and timm already imported by the parent): a crash or hang costs a row."""
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            Path(result).write_text(json.dumps(asdict(job())))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    status = None
    while time.perf_counter() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        fallback.error = f"timeout: no export after {timeout:.0f} s"
    text = Path(result).read_text()
    os.unlink(result)
    if text:
        return Entry(**json.loads(text))
    if fallback.error is None:
        fallback.error = f"export process died (wait status {status})"
    fallback.export_seconds = round(time.perf_counter() - start, 2)
    return fallback


def export_producer(producer: str, out_dir: Path, only: list[str] | None, timeout: float,
                    specs: list[Spec] | None = None, packages: tuple[str, ...] = PACKAGES,
                    extra: dict[str, Any] | None = None) -> int:  # fmt: skip
    """Export every (architecture, attention implementation, exporter) of one producer into ``out_dir``: its
    ``specs`` (default ``SPECS[producer]``), the versions of ``packages`` and the ``extra`` keys in the manifest."""
    import importlib
    import importlib.metadata as metadata

    import onnx  # noqa: F401 - imported before forking, like torch
    import onnxruntime  # noqa: F401
    import torch

    importlib.import_module(producer)  # the producer's package (timm, open_clip, diffusers) before forking
    torch.set_num_threads(1)
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [s for s in (SPECS[producer] if specs is None else specs) if not only or s.name in only]
    skipped = []
    for spec in specs:
        if producer == "timm" and not has_fused_path(spec):
            spec.impls = ("eager",)
            skipped.append(f"{spec.name}_fused")
    jobs = [(s, i, e) for s in specs for i in s.impls for e in ("torchscript", "dynamo")]
    entries = []
    for n, (spec, impl, exporter) in enumerate(jobs, 1):
        name = f"{spec.name}_{impl}" if impl else spec.name
        fallback = Entry(name, exporter, None, 0, spec.flavour, spec.heads, spec.heads, spec.head_dim)
        print(f"[{producer} {n:>3}/{len(jobs)}] {name:<22} {exporter:<11}", end=" ", flush=True)
        entry = _run_forked(lambda s=spec, i=impl, e=exporter: export(s, i, e, out_dir), fallback, timeout)
        state = "ok" if entry.error is None else f"FAILED: {entry.error[:160]}"
        diff = f"diff {entry.framework_max_abs_diff:.1e}" if entry.framework_max_abs_diff is not None else ""
        print(state, f"blocks {entry.blocks}", diff, f"({entry.export_seconds}s)",
              f"[{entry.note[:80]}]" if entry.note else "", flush=True)  # fmt: skip
        entries.append(entry)
    path = out_dir / "manifest.json"
    rows = [asdict(e) for e in entries]
    if only and path.exists():  # a partial re-export replaces its rows and keeps the others
        old = json.loads(path.read_text())
        fresh = {(r["name"], r["exporter"]) for r in rows}
        rows = [r for r in old["models"] if (r["name"], r["exporter"]) not in fresh] + rows
        skipped = sorted(set(old.get("no_fused_path", [])) | set(skipped))
    versions = {}
    for package in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    manifest = {
        "stack": producer, "producer": producer, "versions": versions,
        "torch": versions["torch"], "onnxscript": versions["onnxscript"], "transformers": None,
        "python": platform.python_version(),
        "export_seconds": round(sum(e.export_seconds for e in entries), 1),
        "hidden": 32, "heads": 4, "kv_heads": 4, "layers": 2,
        "no_fused_path": skipped,  # architectures exported only as _eager: their _fused graph would be the same
        **(extra or {}),
        "models": rows,
    }  # fmt: skip
    path.write_text(json.dumps(manifest, indent=1) + "\n")  # last: its presence means the producer is complete
    ok = sum(e.error is None for e in entries)
    print(f"{producer}: {ok}/{len(entries)} exported → {path}", flush=True)
    return 0


def producer_main(argv: list[str] | None, doc: str, producer: str, specs: list[Spec], packages: tuple[str, ...],
                  extra: dict[str, Any] | None = None) -> int:  # fmt: skip
    """The command line of a producer built on this module's exporters (diffusers, torch's own modules):
    ``--out``, ``--only``, ``--timeout``, then :func:`export_producer` in a scratch working directory."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / producer)
    parser.add_argument("--only", nargs="*", help="models (default: all)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per export")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):  # exporters drop *.sarif in cwd
        return export_producer(producer, args.out.resolve(), args.only, args.timeout, specs, packages, extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", nargs="*", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", help="architectures (default: all)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per export")
    args = parser.parse_args(argv)
    for producer in args.producers:
        with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):  # exporters drop *.sarif in cwd
            export_producer(producer, args.out / producer, args.only, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
