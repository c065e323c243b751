"""Run one optimizer on one model in this process and print one JSON line: seconds, peak memory, fused ops.

Used by the benchmarks and the comparison so that every (model, tool) runs in its own process: a crash or a
hang is a row with its reason, not the end of the run, and peak RSS belongs to that tool alone.

    python experiments/optimize_worker.py TOOL MODEL.onnx [--heads N --hidden D --model-type bert] [--out F]

TOOL: egfuse:ort, egfuse:onnx, egfuse:ort:novalidate, egfuse:onnx:novalidate, egfuse:ort:serial (validated
without running the original ahead in a second process), egfuse:ort:keep-opset (the model's opset kept: the ort
target's contrib ops only), egfuse:ort:cuda (``--provider CUDAExecutionProvider``:
forms priced by the CUDA profile; validated on CUDA where this onnxruntime has it), any of those with
``+NAME`` (``--profile-dir``'s NAME.json refits the target as the CLI's ``--profile`` does: a choice timed
before the profile that would make it is fitted), onnxscript, ort;
``--gpu``: onnxruntime's optimizer as a user fusing for CUDA calls it (``use_gpu=True``, ``opt_level=0``: its
ONNX-level fusions, the CUDA session's own graph optimizations come on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path


def fused_counts(model) -> dict[str, int]:
    """The attention ops written, in the graph and in the graphs inside its nodes (an ``If``'s branches: optimum's
    merged decoders hold every block there); ``model`` an ONNX model or an onnx-ir one."""
    import onnx

    counts: dict[str, int] = {}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node if isinstance(graph, onnx.GraphProto) else list(graph):
            if "Attention" in node.op_type:
                key = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
                counts[key] = counts.get(key, 0) + 1
            graphs.extend(_subgraphs(node))
    return counts


def _subgraphs(node) -> list:
    """The graphs in a node's attributes (``onnx.NodeProto`` or ``onnx_ir.Node``)."""
    if not hasattr(node, "attributes"):  # a NodeProto
        found = []
        for attr in node.attribute:
            found.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
        return found
    import onnx_ir as ir

    found = []
    for attr in node.attributes.values():
        value = attr.value
        if isinstance(value, ir.Graph):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, ir.Graph))
    return found


def peak_rss_mb() -> float:
    """This process's own peak resident memory. Linux keeps ``ru_maxrss`` across exec, so a worker started by a
    parent that built models with torch (800 MB) reported the parent's peak for every tool; ``VmHWM`` is the
    high-water mark of this program's own address space."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(
    tool: str,
    path: str,
    heads: int,
    hidden: int,
    model_type: str,
    out: str | None,
    gpu: bool = False,
    profile_dir: str | None = None,
):
    # Imports first: the timed part is the optimizer's own work, from the file to the optimized model.
    if tool.startswith("egfuse"):
        import egfuse

        tool, _, profile = tool.partition("+")
        parts = tool.split(":")
        start = time.perf_counter()
        from egfuse.validation.validate import DEFAULTS, Settings

        providers = ("CUDAExecutionProvider",) if "cuda" in parts else DEFAULTS.providers
        target: object = parts[1]
        if profile:
            from egfuse.commands.calibrate import apply_profile, load_profile
            from egfuse.targets import for_provider, get_target

            chosen = for_provider(get_target(parts[1]), providers)
            target = apply_profile(chosen, load_profile(Path(profile_dir or ".") / f"{profile}.json"))
        result = egfuse.fuse(
            path,
            target=target,
            validate="novalidate" not in parts,
            raise_opset="keep-opset" not in parts,
            validation=Settings(providers=providers, ahead="serial" not in parts),
        )
        model = result.model
        if parts[1] == "npu":  # single-head attention is plain ops: the report says which regions became it
            seconds = time.perf_counter() - start
            if out:
                import onnx

                onnx.save(model, out)
            fused = [r.fused_into for r in result.report.regions if r.status == "fused"]
            return seconds, {name: fused.count(name) for name in set(fused)}
    elif tool == "onnxscript":
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        start = time.perf_counter()
        model, _ = optimize_for_ort(ir.load(path))
        model = ir.serde.serialize_model(model)
    elif tool == "ort":
        from onnxruntime.transformers.optimizer import optimize_model

        start = time.perf_counter()
        gpu_options = {"use_gpu": True, "opt_level": 0} if gpu else {}
        model = optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden, **gpu_options).model
    else:
        raise SystemExit(f"unknown tool {tool}")
    seconds = time.perf_counter() - start
    if out:
        import onnx

        onnx.save(model, out)
    return seconds, fused_counts(model)


def check(original: str, optimized: str, feeds_path: str) -> dict:
    """Does the optimized model load and run on onnxruntime CPU, and how far are its outputs from the original's?"""
    import numpy as np
    import onnxruntime as ort

    feeds = dict(np.load(feeds_path))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    expected = ort.InferenceSession(original, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    try:
        session = ort.InferenceSession(optimized, options, providers=["CPUExecutionProvider"])
    except Exception as err:
        return {"loads": False, "runs": False, "load_error": str(err).strip().splitlines()[-1][:300]}
    try:
        actual = session.run(None, feeds)
    except Exception as err:
        return {"loads": True, "runs": False, "run_error": str(err).strip().splitlines()[-1][:300]}
    diffs = []
    for e, a in zip(expected, actual, strict=True):
        if e.shape != a.shape:
            diffs.append(float("inf"))
            continue
        d = np.abs(e.astype(np.float64) - a.astype(np.float64))
        d = np.where(np.isnan(e) & np.isnan(a), 0.0, d)
        diffs.append(float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0)
    return {"loads": True, "runs": True, "max_abs_diff": max(diffs, default=0.0)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool")
    parser.add_argument("model")
    parser.add_argument("--heads", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=0)
    parser.add_argument("--model-type", default="bert")
    parser.add_argument("--out")
    parser.add_argument("--check", help="feeds (.npz): also run original and optimized on onnxruntime CPU")
    parser.add_argument("--gpu", action="store_true", help="onnxruntime's optimizer as for CUDA (use_gpu=True)")
    parser.add_argument("--profile-dir", help="where a tool's +NAME profile (NAME.json) is")
    args = parser.parse_args()
    record: dict = {"tool": args.tool, "model": args.model}
    try:
        out = args.out or (args.model + f".{args.tool.replace(':', '_')}.tmp.onnx" if args.check else None)
        seconds, fused = run(
            args.tool, args.model, args.heads, args.hidden, args.model_type, out, args.gpu, args.profile_dir
        )
        record.update(ok=True, seconds=seconds, fused=fused)
        if args.check:
            record.update(check(args.model, out, args.check))
            if not args.out:
                os.remove(out)
    except BaseException as err:  # a crash is a result here
        record.update(ok=False, error=f"{type(err).__name__}: {str(err).strip()[:300]}")
        traceback.print_exc(file=sys.stderr)
    record["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
