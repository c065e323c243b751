"""Time prepared models on onnxruntime's CUDA execution provider — the half of the GPU benchmark that runs on the
GPU machine (``experiments/bench_gpu.py`` prepares its folder here and reads its results back).

It needs numpy, onnx and onnxruntime-gpu only (the GPU machine has no egglog): every model was fused here and
travels without its weights (``__random__`` external data, filled with small random values there: latency does
not depend on them). Sessions use onnxruntime's default options with the CUDA provider; inputs and outputs stay
on the device (IOBinding); the variants of a row are interleaved in blocks of five runs after an untimed one, the
order rotated every round, until the row has taken ``--seconds`` and at least ``--rounds`` rounds (the
calibration blocks first, 2 seconds each). Small models that kept their weights are run once on CUDA for the
correctness table. Results are written after every row, so a run cut short by its time limit still returns what
it measured.

    python experiments/gpu_timer.py experiments/corpus/gpu/carry "$OUT" [--seconds 15] [--budget 330]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

PROVIDER, DEVICE = "CUDAExecutionProvider", "cuda"
"""The execution provider timed and where its inputs live (``--provider CPUExecutionProvider``: a dry run)."""
RANDOM = "__random__"
"""The external-data location that marks a weight left behind: filled with random values here."""


def filled(path: Path) -> bytes:
    """The model at ``path`` with its ``__random__`` weights filled (small normal values, seeded by name)."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        where = {e.key: e.value for e in tensor.external_data}
        if tensor.data_location != onnx.TensorProto.EXTERNAL or where.get("location") != RANDOM:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        rng = np.random.default_rng(zlib.crc32(tensor.name.encode()))
        values = (rng.standard_normal(tuple(tensor.dims)) * 0.02).astype(dtype)
        tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    return model.SerializeToString()


def make_inputs(spec: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs from the manifest's description: token ids below ``high``, all-ones masks, normal floats."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, item in spec.items():
        shape, dtype = tuple(item["shape"]), np.dtype(item["dtype"])
        if item["kind"] == "ids":
            out[name] = rng.integers(0, item["high"], shape).astype(dtype)
        elif item["kind"] == "mask":
            out[name] = np.ones(shape, dtype)
        elif item["kind"] == "zeros":
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def cuda_session(model: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=[PROVIDER, "CPUExecutionProvider"])
    if session.get_providers()[0] != PROVIDER:
        raise RuntimeError(f"{PROVIDER} not used (got {session.get_providers()})")
    return session


class Bound:
    """A session with its inputs and outputs bound on the GPU: a run moves no data between host and device."""

    def __init__(self, model: bytes, inputs: dict[str, np.ndarray]) -> None:
        import onnxruntime as ort

        self.session = cuda_session(model)
        self.binding = self.session.io_binding()
        wanted = {i.name for i in self.session.get_inputs()}
        self.values = [ort.OrtValue.ortvalue_from_numpy(a, DEVICE, 0) for k, a in inputs.items() if k in wanted]
        for (name, _), value in zip([(k, a) for k, a in inputs.items() if k in wanted], self.values, strict=True):
            self.binding.bind_ortvalue_input(name, value)
        for output in self.session.get_outputs():
            self.binding.bind_output(output.name, DEVICE)
        self.run()

    def run(self) -> float:
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        return time.perf_counter() - start


def time_row(row: dict, folder: Path, seconds: float, rounds: int, log) -> dict:
    """Median milliseconds of each variant of one (model, length) row, interleaved."""
    inputs = make_inputs(row["inputs"])
    bound, errors = {}, {}
    for tool, rel in row["variants"].items():
        try:
            bound[tool] = Bound(filled(folder / rel), inputs)
        except Exception as err:  # a variant that does not run on CUDA is a result, not the end of the run
            errors[tool] = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
            log(f"  {tool}: {errors[tool]}")
    samples: dict[str, list[float]] = {tool: [] for tool in bound}
    names, began, r = list(bound), time.perf_counter(), 0
    while names and (r < rounds or time.perf_counter() - began < seconds):
        for tool in names[r % len(names) :] + names[: r % len(names)]:
            bound[tool].run()
            samples[tool].extend(bound[tool].run() * 1000 for _ in range(5))
        r += 1
    del bound
    medians = {tool: round(statistics.median(ms), 4) for tool, ms in samples.items() if ms}
    return {"model": row["model"], "seq": row["seq"], "batch": row["batch"], "median_ms": medians,
            "runs": {t: len(ms) for t, ms in samples.items()}, "errors": errors}  # fmt: skip


def float_outputs(model: bytes) -> bytes:
    """The model with each bfloat16 output cast to float32: onnxruntime's Python API returns no bfloat16 array."""
    proto = onnx.load_from_string(model)
    graph = proto.graph
    for output in graph.output:
        if output.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16:
            inner = output.name + "_bf16"
            for node in graph.node:
                node.output[:] = [inner if o == output.name else o for o in node.output]
            graph.node.append(onnx.helper.make_node("Cast", [inner], [output.name], to=onnx.TensorProto.FLOAT))
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return proto.SerializeToString()


def check_model(check: dict, folder: Path) -> dict:
    """One small model with its weights on CUDA: each variant's output against the original's, over the query
    rows the attention mask keeps (a padded position's output is whatever its fully masked rows give), and the
    original on CUDA against the original on CPU (the providers' own difference)."""
    import onnxruntime as ort

    feeds = dict(np.load(folder / check["feeds"]))
    keep = feeds[check["mask"]].astype(bool) if check.get("mask") else None
    out: dict = {"name": check["name"], "max_abs_diff": {}, "errors": {}}
    original = float_outputs((folder / check["variants"]["original"]).read_bytes())
    expected = cuda_session(original).run(None, feeds)[0].astype(np.float64)
    try:
        cpu = ort.InferenceSession(original, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    except Exception:  # bfloat16: the CPU provider has no kernels for most of the model
        cpu = None

    def diff(a: np.ndarray) -> float:
        d = np.abs(a.astype(np.float64) - expected)
        d = d[keep] if keep is not None and d.shape[:2] == keep.shape else d
        return float(np.nan_to_num(d, nan=np.inf).max())

    out["cuda_vs_cpu_original"] = diff(cpu) if cpu is not None else None
    for tool, rel in check["variants"].items():
        if tool == "original":
            continue
        try:
            fused = float_outputs((folder / rel).read_bytes())
            out["max_abs_diff"][tool] = diff(cuda_session(fused).run(None, feeds)[0])
        except Exception as err:
            out["errors"][tool] = str(err).strip().splitlines()[-1][:300]
    return out


def probe_mask_types() -> dict:
    """Whether CUDA's kernels take a float32 mask beside float16 (and bfloat16) Q/K/V — the standard
    ``Attention``'s mask type is free (``U``), and egfuse writes a half-precision select mask in float32 so a
    query row whose every key is masked stays the mean of V — and what such a row gives there."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    out: dict = {}
    for name, elem in (("float16", TensorProto.FLOAT16), ("bfloat16", TensorProto.BFLOAT16)):
        dtype = np.float32  # the model casts them to the type probed
        # float32 inputs cast inside (onnxruntime's Python API takes no bfloat16 array), the output cast back
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "qkvm"]
        nodes = [helper.make_node("Cast", [n], [n + "_h"], to=elem) for n in "qkv"]
        nodes.append(helper.make_node("Attention", ["q_h", "k_h", "v_h", "m"], ["y_h"], scale=1.0))
        nodes.append(helper.make_node("Cast", ["y_h"], ["y"], to=TensorProto.FLOAT))
        graph = helper.make_graph(nodes, "probe", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
        q, k, v = ((rng.standard_normal((2, 4, 8, 64)) * 8).astype(dtype) for _ in range(3))
        mask = np.zeros((2, 1, 8, 8), np.float32)
        mask[0, 0, 0, :] = np.nextafter(np.finfo(np.float32).min, 0)  # a row masked entirely
        mask[1, 0, :, 4:] = -1e30
        try:
            y = cuda_session(model.SerializeToString()).run(None, {"q": q, "k": k, "v": v, "m": mask})[0]
            mean = v[0].astype(np.float64).mean(axis=1)
            out[name] = {
                "runs": True,
                "fully_masked_row_vs_mean_of_v": float(np.abs(y[0, :, 0].astype(np.float64) - mean).max()),
            }
        except Exception as err:
            out[name] = {"runs": False, "error": str(err).strip().splitlines()[-1][:300]}
    return out


def probe_bfloat16_kernels() -> dict:
    """Which of the ops egfuse writes load and run in bfloat16 on CUDA (a node without a CUDA kernel falls back to
    the CPU provider, which has none in bfloat16 either: the session fails)."""
    from onnx import TensorProto, helper

    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    ops = {
        "com.microsoft.Gelu": ("Gelu", "com.microsoft", ["x"], {}),
        "com.microsoft.BiasGelu": ("BiasGelu", "com.microsoft", ["x", "w"], {}),
        "com.microsoft.SkipLayerNormalization": ("SkipLayerNormalization", "com.microsoft", ["x", "x", "w", "w"], {}),
        "Gelu (opset 20)": ("Gelu", "", ["x"], {}),
        "LayerNormalization": ("LayerNormalization", "", ["x", "w", "w"], {"axis": -1}),
    }
    out: dict = {}
    for name, (op, domain, args, attrs) in ops.items():
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w")]
        nodes = [helper.make_node("Cast", [n], [n + "_h"], to=TensorProto.BFLOAT16) for n in ("x", "w")]
        nodes.append(helper.make_node(op, [a + "_h" for a in args], ["y_h"], domain=domain, **attrs))
        nodes.append(helper.make_node("Cast", ["y_h"], ["y"], to=TensorProto.FLOAT))
        graph = helper.make_graph(nodes, "probe", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        imports = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=imports, ir_version=10)
        try:
            cuda_session(model.SerializeToString()).run(None, {"x": x, "w": w})
            out[name] = {"runs": True}
        except Exception as err:
            out[name] = {"runs": False, "error": str(err).strip().splitlines()[-1][:200]}
    return out


def device_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=15.0, help="time each row at least this long")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--budget", type=float, default=330.0, help="stop starting new rows after this long")
    parser.add_argument("--provider", default="CUDAExecutionProvider", help="CPUExecutionProvider: a dry run here")
    parser.add_argument("--only", nargs="+", help="time only these rows, checks and calibration cases (their names)")
    args = parser.parse_args(argv)
    global PROVIDER, DEVICE
    PROVIDER, DEVICE = args.provider, "cuda" if args.provider == "CUDAExecutionProvider" else "cpu"
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    manifest = json.loads((args.folder / "manifest.json").read_text())
    if args.only:
        manifest["rows"] = [r for r in manifest["rows"] if r["model"] in args.only]
        manifest["checks"] = [c for c in manifest.get("checks", []) if c["name"] in args.only]
        manifest["calibration"] = [c for c in manifest.get("calibration", []) if c["case"] in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"device": device_name(), "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
              "seconds_per_row": args.seconds, "rows": [], "checks": [], "calibration": []}  # fmt: skip
    began = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f}s] {text}", flush=True)

    def save() -> None:
        (args.out / "gpu_raw.json").write_text(json.dumps(result, indent=1))

    log(f"{result['device']}, onnxruntime {result['onnxruntime']}, {result['providers']}")
    try:
        result["probes"] = {
            "float32 mask beside half-precision Q/K/V": probe_mask_types(),
            "bfloat16 kernels": probe_bfloat16_kernels(),
        }
    except Exception as err:  # a probe is not the run
        result["probes"] = {"error": str(err)[:300]}
    log(f"probes: {result['probes']}")
    save()
    for check in manifest.get("checks", []):
        try:
            result["checks"].append(check_model(check, args.folder))
        except Exception as err:  # the original does not run here (a bfloat16 op without a kernel): a result
            reason = str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
            result["checks"].append({"name": check["name"], "error": reason, "max_abs_diff": {}, "errors": {}})
        log(f"check {check['name']}: {result['checks'][-1]}")
        save()
    # the blocks the profile is fitted on first: a run cut short by its time limit loses rows, not the fit
    for case in manifest.get("calibration", []):
        if time.perf_counter() - began > args.budget:
            break
        timed = time_row({**case, "model": case["case"], "seq": 0, "batch": 0}, args.folder, 2.0, 3, log)
        result["calibration"].append({"case": case["case"], "median_ms": timed["median_ms"], "errors": timed["errors"]})
        log(f"calibration {case['case']}: {timed['median_ms']}")
        save()
    for row in manifest["rows"]:
        if time.perf_counter() - began > args.budget:
            log(f"budget spent: {row['model']} S={row['seq']} not timed")
            continue
        log(f"{row['model']} B={row['batch']} S={row['seq']}")
        result["rows"].append(time_row(row, args.folder, args.seconds, args.rounds, log))
        log(f"  {result['rows'][-1]['median_ms']}")
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
