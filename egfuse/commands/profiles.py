"""Cost profiles: measured times fitted into a target's cost parameters, and a profile read back into a target.

:mod:`egfuse.commands.calibrate` measures (it fuses and times attention blocks); this module is what the numbers become
— the least-squares fit of each op's efficiency and overhead, the JSON profile's version and checks, and the target
a profile refits. Reading a profile needs none of the measuring machinery, so ``egfuse optimize --profile`` and
folder runs import only this.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from egfuse.targets.spec import TargetSpec

PROFILE_VERSION = 1


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
    """What one calibration run measured for a target: a row per (case, form), the fit's input."""

    target: str
    rows: list[Measured] = field(default_factory=list)


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
