"""A folder of models fused at once: ``egfuse optimize ZOO/ -o FUSED/ -j 4``.

Every ``.onnx`` under the folder is fused in a job of its own (:mod:`egfuse.commands.fanout`: local processes, or a Ray
cluster), written at the same relative path under the output folder with its report beside it
(``<name>.report.json``). The run's ledger, ``egfuse-batch.json`` in the output folder, records each model's
outcome as it finishes, so a run that is interrupted or crashes resumes where it stopped: a model is skipped
when the ledger has it done with the same options and its input has not changed since. One model's failure
(a bad file, a crash) is its line in the ledger, never the end of the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from egfuse.commands.fanout import Crashed, fan_out
from egfuse.errors import EgfuseError
from egfuse.files.save import write_text
from egfuse.version import __version__

__all__ = ["LEDGER", "Options", "Outcome", "models_under", "optimize_folder"]

LEDGER = "egfuse-batch.json"
REPORT_SUFFIX = ".report.json"


@dataclass(frozen=True)
class Options:
    """What each model is fused with (``egfuse optimize``'s flags); part of the ledger, so a run with other
    options fuses every model again."""

    target: str = "ort"
    validate: bool = True
    shapes: dict[str, int] | None = None
    rotary: bool = True
    raise_opset: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    validation_bytes: int | None = 4 << 30
    profile: str | None = None

    def key(self) -> str:
        return json.dumps({**asdict(self), "egfuse": __version__}, sort_keys=True)


@dataclass
class Outcome:
    """One model's line in the ledger. ``status``: fused (something rewritten and, if asked, validated),
    unchanged (nothing to fuse, or every region rolled back), failed (an error about that model), crashed."""

    model: str  # relative to the input folder
    status: str
    fused: int = 0
    regions: int = 0
    validated: bool | None = None
    seconds: float = 0.0
    message: str = ""
    input_mtime: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in ("fused", "unchanged")


def models_under(folder: Path, output: Path | None = None) -> list[Path]:
    """Every ``.onnx`` file under ``folder``, in a stable order — not those under ``output`` (an output folder
    inside the input folder is not more input)."""
    found = []
    for path in sorted(folder.rglob("*.onnx")):
        if output is not None and output.resolve() in path.resolve().parents:
            continue
        if path.is_file():
            found.append(path)
    return found


def optimize_folder(
    folder: Path,
    output: Path,
    options: Options,
    *,
    workers: int = 1,
    ray_address: str | None = None,
    echo: Callable[[str], None] = print,
) -> list[Outcome]:
    """Fuse every model under ``folder`` into ``output`` (see the module), resuming from the ledger there."""
    if not folder.is_dir():
        raise EgfuseError("not a folder", path=str(folder))
    if output.exists() and not output.is_dir():
        raise EgfuseError("a folder of models is written into a folder; this is a file", path=str(output))
    if output.resolve() == folder.resolve():
        raise EgfuseError("the output folder is the input folder: fused models would replace their originals",
                          path=str(output))  # fmt: skip
    models = models_under(folder, output)
    if not models:
        raise EgfuseError("no .onnx files under this folder", path=str(folder))
    ledger = _read_ledger(output / LEDGER, options)
    names = {p: p.relative_to(folder).as_posix() for p in models}
    outcomes = {names[p]: ledger.get(names[p]) for p in models}
    todo = [p for p in models if not _still_done(outcomes[names[p]], p, output / names[p])]
    read_at = {p: p.stat().st_mtime for p in todo}  # before fusing: an input changed meanwhile is fused again
    echo(f"{len(models)} models under {folder}: {len(models) - len(todo)} done before, fusing {len(todo)}")
    jobs = [(str(p), str(output / names[p]), options) for p in todo]
    results = fan_out(_optimize_one, jobs, workers=workers, ray_address=ray_address)
    output.mkdir(parents=True, exist_ok=True)
    for finished, (index, result) in enumerate(results, 1):
        model = names[todo[index]]
        outcome = _outcome(model, read_at[todo[index]], result)
        outcomes[model] = outcome
        _write_ledger(output / LEDGER, options, outcomes)
        echo(f"[{finished}/{len(todo)}] {model}: {_line(outcome)}")
    final = [o for o in outcomes.values() if o is not None]
    counts = {s: sum(o.status == s for o in final) for s in ("fused", "unchanged", "failed", "crashed")}
    echo(", ".join(f"{n} {s}" for s, n in counts.items() if n) + f"; ledger {output / LEDGER}")
    return final


def _optimize_one(source: str, destination: str, options: Options) -> dict[str, Any]:
    """In the worker: fuse one model, write it and its report; the fields of its :class:`Outcome`."""
    from egfuse.api import Budgets, fuse
    from egfuse.validation.validate import Settings

    start = time.perf_counter()
    target: Any = options.target
    if options.profile:
        from egfuse.commands.calibrate import profiled_target

        target = profiled_target(options.target, Path(options.profile), options.providers)  # as the CLI does
    result = fuse(
        source,
        target=target,
        validate=options.validate,
        shapes=options.shapes,
        budgets=Budgets(validation_bytes=options.validation_bytes),
        rotary=options.rotary,
        raise_opset=options.raise_opset,
        validation=Settings(options.atol, options.rtol, options.providers),
    )
    result.save(destination)
    report = result.report
    write_text(Path(_report_path(destination)), report.to_json() + "\n")
    return {
        "status": "fused" if report.changed and report.validated is not False else "unchanged",
        "fused": report.fused,
        "regions": len(report.regions),
        "validated": report.validated,
        "seconds": round(time.perf_counter() - start, 3),
        "message": report.loud_note() or "",
        "ops": report.fused_ops(),
    }


def _report_path(destination: str) -> str:
    return str(Path(destination).with_suffix("")) + REPORT_SUFFIX


def _outcome(model: str, mtime: float, result: Any) -> Outcome:
    if isinstance(result, dict):
        return Outcome(model, input_mtime=mtime, **result)
    if isinstance(result, Crashed):
        return Outcome(model, "crashed", message=str(result), input_mtime=mtime)
    if isinstance(result, EgfuseError):
        return Outcome(model, "failed", message=str(result), input_mtime=mtime)
    return Outcome(model, "failed", message=f"internal error: {type(result).__name__}: {result}", input_mtime=mtime)


def _line(outcome: Outcome) -> str:
    if outcome.status in ("failed", "crashed"):
        return f"{outcome.status}: {outcome.message}"
    proof = {True: "validated", False: "not validated", None: "not checked"}[outcome.validated]
    ops = ", ".join(f"{op} ×{n}" for op, n in outcome.ops.items())
    return (
        f"{outcome.fused}/{outcome.regions} attention regions fused, {proof}"
        + (f" ({ops})" if ops else "")
        + f", {outcome.seconds:.1f} s"
    )


def _still_done(outcome: Outcome | None, source: Path, destination: Path) -> bool:
    """Recorded done, and neither the input changed nor the output vanished since."""
    return (
        outcome is not None
        and outcome.done
        and destination.is_file()
        and Path(_report_path(str(destination))).is_file()
        and source.stat().st_mtime <= outcome.input_mtime
    )


def _read_ledger(path: Path, options: Options) -> dict[str, Outcome]:
    """The outcomes of an earlier run with the same options; nothing for a missing, unreadable or other one."""
    try:
        data = json.loads(path.read_text())
        if data.get("options") != options.key():
            return {}
        return {name: Outcome(**row) for name, row in data.get("models", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _write_ledger(path: Path, options: Options, outcomes: dict[str, Outcome | None]) -> None:
    rows = {name: asdict(o) for name, o in outcomes.items() if o is not None}
    write_text(path, json.dumps({"options": options.key(), "models": rows}, indent=1) + "\n")
