"""What the operator microbenchmarks (``bench_rotary.py``, ``bench_gqa.py``) share: a small graph as a model
at opset 23 with the com.microsoft domain, CPU sessions, and timing that interleaves the contenders run by run
(so a noisy moment costs all of them alike) and reports medians, and where their figures go."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

RESULTS = Path(__file__).parent / "results"


def make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    )
    proto.ir_version = 10
    return proto


def sessions(models: dict[str, onnx.ModelProto]) -> dict[str, ort.InferenceSession]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return {name: ort.InferenceSession(m.SerializeToString(), options) for name, m in models.items()}


def interleaved_medians(
    contenders: dict[str, ort.InferenceSession], feeds: dict[str, np.ndarray], runs: int
) -> dict[str, float]:
    """Median seconds of each session over ``runs`` rounds, each round running every session once."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, sess in contenders.items():
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def write_results(stem: str, data: dict, table: list[str]) -> None:
    """``results/<stem>.json`` (``data`` with the onnxruntime version) and ``results/<stem>.md`` (``table``)."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"onnxruntime": ort.__version__, **data}, indent=2))
    (RESULTS / f"{stem}.md").write_text("\n".join(table) + "\n")
