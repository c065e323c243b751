"""Calibration: time every form a target can write on the local onnxruntime, fit the target's cost
parameters, and write them as a profile (JSON) that ``egfuse optimize --profile`` reads.

Each case is one attention block (:func:`egfuse.testing.attention_model`) at a realistic width and a shape
binding (encoder, prefill, decode over a cache, grouped K/V heads). egfuse fuses it once per form the
target can write (the target restricted to that one op), and the unfused block is timed beside them:
sessions with onnxruntime's default options, runs interleaved so the machine's drift hits every form alike,
medians kept. The fit is a line per fused op — measured time of the op against its roofline work —
whose slope is the op's efficiency and whose intercept its fixed overhead, and one scale for the primitive
ops' throughput (:mod:`egfuse.commands.profiles`, re-exported here). What the fit predicts is checked against the
measurement by experiments/cost_model.py.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import numpy as np
import onnx

from egfuse.commands.profiles import (
    PROFILE_VERSION,
    Calibration,
    Measured,
    apply_profile,
    fit,
    load_profile,
    profiled_target,
)
from egfuse.report import Status
from egfuse.targets.spec import FusedOp, TargetSpec


@dataclass(frozen=True)
class Case:
    """One attention block and the sizes it runs at."""

    name: str
    variant: dict
    sizes: dict[str, int]  # batch, seq, past_seq (the cache), kv_seq (cross-attention memory)

    def binding(self) -> dict[str, int]:
        b = dict(self.sizes)
        b["total_seq"] = b.get("past_seq", 0) + b["seq"]
        return b


WIDTH = {"heads": 12, "head_dim": 64, "k_layout": "transpose_0132"}


def grid(quick: bool = False) -> list[Case]:
    """Encoders and prefill at several lengths, decode steps over short and long caches, GQA."""
    cases = []
    for seq in (32, 128, 512) if not quick else (32, 256):
        cases.append(Case(f"encoder S={seq}", {**WIDTH}, {"batch": 1, "seq": seq}))
        cases.append(Case(f"gqa S={seq}", {**WIDTH, "kv_heads": 4, "causal": "trilu"}, {"batch": 1, "seq": seq}))
    for past in (128, 1024) if not quick else (512,):
        cases.append(Case(f"decode past={past}", {**WIDTH, "past": True}, {"batch": 1, "seq": 1, "past_seq": past}))
        cases.append(
            Case(
                f"gqa decode past={past}",
                {**WIDTH, "kv_heads": 4, "past": True},
                {"batch": 1, "seq": 1, "past_seq": past},
            )
        )
    if not quick:
        cases.append(Case("encoder B=8 S=64", {**WIDTH}, {"batch": 8, "seq": 64}))
    return cases


def feeds(model: onnx.ModelProto, case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at the case's sizes: float data random, masks all zero (nothing padded; the work is the same)."""
    rng = np.random.default_rng(seed)
    sizes = case.binding()
    out = {}
    for value in model.graph.input:
        dims = [d.dim_value or sizes[d.dim_param] for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if value.name == "mask":
            out[value.name] = np.zeros(dims, dtype) if np.issubdtype(dtype, np.floating) else np.ones(dims, dtype)
        else:
            out[value.name] = rng.standard_normal(dims).astype(dtype)
    return out


def forms(case: Case, spec: TargetSpec) -> tuple[onnx.ModelProto, list[dict], dict[str, onnx.ModelProto]]:
    """The case's block, the candidates extraction priced for it, and the block written in each runnable form."""
    from egfuse.api import fuse
    from egfuse.testing import Variant, attention_model

    model = attention_model(Variant(**case.variant))
    spec = spec.for_shapes(case.binding())
    result = fuse(model, target=spec, validate=False)
    candidates = result.report.regions[0].candidates if result.report.regions else []
    written = {"unfused": model}
    for candidate in candidates:
        if candidate["form"] == "unfused" or candidate.get("cost_us") is None:
            continue
        # The one op, made nearly free so extraction writes it even where the graph's ops are predicted cheaper.
        only = replace(
            spec,
            ops=tuple(
                replace(op, efficiency=1e6, overhead_us=0.0) for op in spec.ops if op.constructor == candidate["form"]
            ),
        )
        forced = fuse(model, target=only, validate=False)
        if forced.report.fused == 1:
            written[candidate["form"]] = forced.model
    region = result.report.regions[0] if result.report.regions else None
    chosen = region.form if region is not None and region.status == Status.FUSED else "unfused"
    for candidate in candidates:
        candidate["chosen"] = candidate["form"] == chosen
    return model, candidates, written


def primitive_nodes(model: onnx.ModelProto, op: str) -> int:
    """The nodes of a form as written other than its fused op (``op``: the report's label, ``domain.Op``)."""
    return sum(1 for n in model.graph.node if n.op_type != op.rsplit(".", 1)[-1])


def time_models(
    models: dict[str, onnx.ModelProto],
    inputs: dict,
    rounds: int = 15,
    repeat: int = 3,
    provider: str = "CPUExecutionProvider",
) -> dict[str, float]:
    """Median µs per run of each model, with onnxruntime's default session options, interleaved."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = {}
    for name, model in models.items():
        session = ort.InferenceSession(model.SerializeToString(), options, providers=[provider, "CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        sessions[name] = (session, {k: v for k, v in inputs.items() if k in wanted})
        for _ in range(3):
            session.run(None, sessions[name][1])
    samples: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, (session, feed) in sessions.items():
            start = time.perf_counter()
            for _ in range(repeat):
                session.run(None, feed)
            samples[name].append((time.perf_counter() - start) / repeat * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(
    spec: TargetSpec, cases: list[Case], rounds: int = 15, log=print, provider: str = "CPUExecutionProvider"
) -> Calibration:
    calibration = Calibration(spec.name)
    for case in cases:
        model, candidates, written = forms(case, spec)
        times = time_models(written, feeds(model, case), rounds, provider=provider)
        for candidate in candidates:
            if candidate["form"] not in times:
                continue
            row = Measured(
                case.name,
                candidate["form"],
                candidate["op"],
                float(candidate["cost_us"]),
                times[candidate["form"]],
                float(candidate.get("own_us", 0.0)),
                float(candidate.get("roofline_us", 0.0)),
                bool(candidate.get("chosen")),
                primitive_nodes(written[candidate["form"]], candidate["op"]),
            )
            calibration.rows.append(row)
            log(f"  {case.name:<22} {row.form:<17} predicted {row.predicted_us:9.1f}, measured {row.measured_us:9.1f}")
    return calibration


def calibrate(
    spec: TargetSpec, *, quick: bool = False, rounds: int = 15, log=print, provider: str = "CPUExecutionProvider"
) -> tuple[dict, Calibration]:
    """Measure ``spec``'s forms over the grid on ``provider`` and fit its profile."""
    calibration = measure(spec, grid(quick), rounds, log, provider)
    profile = fit(spec, calibration)
    if provider != "CPUExecutionProvider":
        profile["provider"] = provider
    return profile, calibration


__all__ = [
    "PROFILE_VERSION",
    "Calibration",
    "Case",
    "FusedOp",
    "Measured",
    "apply_profile",
    "calibrate",
    "fit",
    "grid",
    "load_profile",
    "measure",
    "profiled_target",
]
