"""Calibration: time every form a target can write on the local onnxruntime, fit the target's cost
parameters, and write them as a profile (JSON) that ``egfuse optimize --profile`` reads.

Each case is one attention block (:func:`egfuse.testing.attention_model`) at a realistic width and a shape
binding (encoder, prefill, decode over a cache, grouped K/V heads). egfuse fuses it once per form the
target can write (the target restricted to that one op), and the unfused block is timed beside them:
sessions with onnxruntime's default options, runs interleaved so the machine's drift hits every form alike,
medians kept. The fit is a line per fused op — measured time of the op against its roofline work —
whose slope is the op's efficiency and whose intercept its fixed overhead, and one scale for the primitive
ops' throughput. What the fit predicts is checked against the measurement by experiments/cost_model.py.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from egfuse.report import Status
from egfuse.targets.spec import FusedOp, TargetSpec

PROFILE_VERSION = 1


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


@dataclass
class Measured:
    """One (case, form): what the cost model predicted and what onnxruntime took."""

    case: str
    form: str
    op: str
    predicted_us: float
    measured_us: float
    own_us: float = 0.0  # the fused op's own predicted cost (0 for the unfused form)
    roofline_us: float = 0.0  # its work at full efficiency
    chosen: bool = False  # the form extraction picked for this case
    nodes: int = 0  # the primitive nodes of the form as written (all of them unfused; 0: not counted)


@dataclass
class Calibration:
    target: str
    rows: list[Measured] = field(default_factory=list)


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


def fit(spec: TargetSpec, calibration: Calibration) -> dict:
    """The profile: one least-squares fit, in relative error, of every measured time as

        measured ≈ α · (the primitive ops' roofline work) + β · (their node count) + a_op · roofline_op + o_op

    (the unfused form: its primitive ops alone). α rescales the primitive roofline (throughputs divided by it),
    β is the time each primitive node costs on its own (a kernel launch on a GPU, an op's dispatch on a CPU:
    a throughput and a per-node cost that scale apart — a GPU is 1000× a CPU's throughput but not its launch
    time), a_op and o_op give each fused op its efficiency (α / a_op: the op's roofline is rescaled too) and
    fixed overhead. Rows whose node counts were not taken (``nodes`` 0) fit β as the target's per-node cost
    times α, as before. Linear in (α, β, a, o), so solved exactly; clipped positive."""
    rows = [r for r in calibration.rows if r.measured_us > 0 and r.predicted_us > 0]
    costs = spec.costs
    per_node = bool(rows) and all(r.nodes > 0 for r in rows if r.form == "unfused")
    fused_ops = sorted({r.form for r in rows if r.form != "unfused" and r.roofline_us > 0})
    first = 2 if per_node else 1
    a = np.zeros((len(rows), first + 2 * len(fused_ops)))
    b = np.ones(len(rows))
    for i, r in enumerate(rows):
        weight = 1.0 / r.measured_us  # relative error: 100 µs decode steps count as much as 20 ms prefills
        primitive = r.predicted_us - r.own_us
        if per_node:
            a[i, 0] = max(primitive - r.nodes * costs.op_overhead_us, 0.0) * weight
            a[i, 1] = r.nodes * weight
        else:
            a[i, 0] = primitive * weight
        if r.form in fused_ops:
            j = first + 2 * fused_ops.index(r.form)
            a[i, j], a[i, j + 1] = r.roofline_us * weight, weight
    solution = _nonnegative_least_squares(a, b)
    alpha = max(float(solution[0]), 1e-6)
    per_node_us = float(solution[1]) if per_node else costs.op_overhead_us * alpha
    fitted_costs = replace(
        costs, gflops=costs.gflops / alpha, gbytes=costs.gbytes / alpha, op_overhead_us=round(per_node_us, 4)
    )
    ops = {}
    for k, form in enumerate(fused_ops):
        slope, intercept = float(solution[first + 2 * k]), float(solution[first + 1 + 2 * k])
        ops[form] = {
            "efficiency": round(alpha / max(slope, 1e-9), 4),
            "overhead_us": round(max(intercept - fitted_costs.op_overhead_us, 0.0), 3),
        }
    return {
        "version": PROFILE_VERSION,
        "target": spec.name,
        "onnxruntime": _ort_version(),
        "machine": f"{platform.machine()}, {platform.processor() or platform.system()}",
        "cases": len({r.case for r in rows}),
        "costs": asdict(fitted_costs),
        "ops": ops,
    }


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """min ‖a x − b‖ with x ≥ 0: the unconstrained solution, then the negative entries fixed at 0 and the
    rest re-solved (a handful of columns: the active set settles in a few rounds)."""
    free = np.ones(a.shape[1], bool)
    x = np.zeros(a.shape[1])
    for _ in range(iterations):
        x = np.zeros(a.shape[1])
        x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        negative = free & (x < 0)
        if not negative.any():
            break
        free &= ~negative
    return np.clip(x, 0.0, None)


def apply_profile(spec: TargetSpec, profile: dict) -> TargetSpec:
    """``spec`` with a profile's fitted parameters (ops the profile does not name keep theirs)."""
    return spec.with_profile(profile)


def profiled_target(name: str, path: str | Path, providers: tuple[str, ...]) -> TargetSpec:
    """The registered target ``name`` as priced for the first of ``providers`` it has a variant for, refitted by
    the profile at ``path``: a CUDA profile refits the CUDA variant (its ops, its element types), not the CPU's.
    The CLI's ``--profile`` and folder runs both read a profile this way."""
    from egfuse.targets import for_provider, get_target

    return apply_profile(for_provider(get_target(name), providers), load_profile(path))


def load_profile(path: str | Path) -> dict:
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable egfuse profile ({err})") from None
    if not isinstance(profile, dict) or profile.get("version") != PROFILE_VERSION:
        raise ValueError(f"{path}: not an egfuse profile of version {PROFILE_VERSION}")
    return profile


def _ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__


def calibrate(
    spec: TargetSpec, *, quick: bool = False, rounds: int = 15, log=print, provider: str = "CPUExecutionProvider"
) -> tuple[dict, Calibration]:
    """Measure ``spec``'s forms over the grid on ``provider`` and fit its profile."""
    calibration = measure(spec, grid(quick), rounds, log, provider)
    profile = fit(spec, calibration)
    if provider != "CPUExecutionProvider":
        profile["provider"] = provider
    return profile, calibration


__all__ = ["Case", "FusedOp", "apply_profile", "calibrate", "fit", "grid", "load_profile", "measure"]
