"""Robustness at scale: ``egfuse optimize`` on hundreds of broken inputs and unlucky paths, counting what a user
must never see.

Inputs: the named cases of issue 18 (malformed graphs: an undefined input, a cycle, a missing output, IR
version 0, a name defined twice, tensor data off its shape; unsafe outputs: the report onto the model, the
report onto the output, a missing or read-only folder, an existing folder, an empty name, a path under a
file, a 250-character name, a FIFO, a symlink, a device; wrong ``--feeds``), then mutations drawn with fixed
seeds (:mod:`egfuse.testing.mutate`): byte-level faults in the protobuf of four attention blocks (flipped
bytes, cuts, spliced garbage, zeroed spans), graph-level faults (a renamed input, a dropped, duplicated or
moved node, dims, attributes, data, op types, types and opsets changed) and garbage bytes.

Each runs the CLI in this process (``egfuse.commands.cli.main``) in a fresh folder. Counted:

* ``tracebacks``: a run that printed a traceback or let an exception escape;
* ``internal_errors``: a run that ended in egfuse's catch-all line (a bug of ours, said in one line);
* ``inputs_modified``: a run after which an input file's bytes differ;
* ``partial_outputs``: a run that left a half-written output, a temporary file, or an output although it
  failed;
* and what the runs ended in: ``fused`` / ``unchanged`` (exit 0), ``refused`` (exit 1 or 2, one line).

    python experiments/robustness.py          # ~1.5 min on 2 cores

Writes results/robustness.json (``inputs_tried``, ``tracebacks``, ``inputs_modified``, ``partial_outputs``, …)
and results/robustness.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from egfuse.commands import cli  # noqa: E402
from egfuse.testing import Variant, attention_model, feeds_for  # noqa: E402
from egfuse.testing.mutate import GRAPH_MUTATIONS, mutate_bytes, mutate_graph  # noqa: E402

RESULTS = HERE / "results"

BASES = {
    "encoder, padding": Variant(heads=2),
    "gqa, causal": Variant(heads=4, kv_heads=2, k_layout="transpose_0132", causal="trilu"),
    "kv cache": Variant(heads=2, past=True, k_layout="transpose_0132", causal="trilu"),
    "rope": Variant(heads=2, rope=True, rope_tables="positions", k_layout="transpose_0132", causal="trilu"),
}

ROOT_SKIP = "output: -o in a read-only folder (run as root, who may write anywhere)"

COUNTED = ("traceback", "internal_error", "input_modified", "partial_output")
"""What must never happen, per run."""

Setup = Callable[[Path], list[str]]
"""Writes a case's files into a fresh folder; returns the CLI's arguments."""


def run_case(setup: Setup) -> dict:
    """One CLI run in a fresh folder: its exit code, what it printed, and what it did to the folder."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        argv = setup(folder)
        before = _snapshot(folder)
        out, err = io.StringIO(), io.StringIO()
        escaped = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 2
            except BaseException:
                code, escaped = -1, traceback.format_exc()
        after = _snapshot(folder)
        stderr = err.getvalue()
        output = _output_path(argv)
        new = sorted(set(after) - set(before))
        return {
            "code": code,
            "traceback": escaped is not None or "Traceback" in stderr,
            "internal_error": "internal error" in stderr,
            "input_modified": any(after.get(path) != data for path, data in before.items()),
            "partial_output": _partial(new, code, output, folder),
            "one_line": code == 0 or len(stderr.strip().splitlines()) == 1,
            "message": _last_line(escaped or stderr).replace(str(folder), "<folder>")[:240],
        }


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _snapshot(folder: Path) -> dict[str, object]:
    entries: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            entries[str(path.relative_to(folder))] = ("link", os.readlink(path))
        elif path.is_file():
            entries[str(path.relative_to(folder))] = path.read_bytes()
        else:
            entries[str(path.relative_to(folder))] = ("kind", path.lstat().st_mode & 0o170000)
    return entries


def _output_path(argv: list[str]) -> str | None:
    return argv[argv.index("-o") + 1] if "-o" in argv else None


def _partial(new: list[str], code: int, output: str | None, folder: Path) -> bool:
    """A file left that should not be: a temporary, anything after a failed run, an output that is not a
    whole model."""
    if code != 0:
        return bool(new)
    for name in new:
        path = folder / name
        if name.startswith(".") or ".tmp" in name:
            return True
        if path.suffix == ".onnx":
            try:
                onnx.load(str(path))
            except Exception:
                return True
    return False


# ------------------------------------------------------------------------------------------- the named cases


def _model_case(model: onnx.ModelProto, *extra: str) -> Setup:
    def setup(folder: Path) -> list[str]:
        onnx.save(model, folder / "model.onnx")
        return ["optimize", str(folder / "model.onnx"), "-o", str(folder / "fused.onnx"), *extra]

    return setup


def _bytes_case(data: bytes) -> Setup:
    def setup(folder: Path) -> list[str]:
        (folder / "model.onnx").write_bytes(data)
        return ["optimize", str(folder / "model.onnx"), "-o", str(folder / "fused.onnx"), "-q"]

    return setup


def _output_case(output: Callable[[Path], str], report: Callable[[Path], str] | None = None) -> Setup:
    model = attention_model(BASES["encoder, padding"])

    def setup(folder: Path) -> list[str]:
        onnx.save(model, folder / "model.onnx")
        (folder / "a_file").write_text("x")
        argv = ["optimize", str(folder / "model.onnx"), "-o", output(folder), "-q"]
        return argv + (["--report", report(folder)] if report else [])

    return setup


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "fifo.onnx")
    return str(folder / "fifo.onnx")


def _symlink(folder: Path) -> str:
    (folder / "target.onnx").write_text("keep me")
    (folder / "link.onnx").symlink_to(folder / "target.onnx")
    return str(folder / "link.onnx")


def _read_only(folder: Path) -> str:
    (folder / "ro").mkdir()
    (folder / "ro").chmod(0o500)
    return str(folder / "ro" / "fused.onnx")


def _feeds_case(rename: bool, no_validate: bool) -> Setup:
    model = attention_model(BASES["encoder, padding"])

    def setup(folder: Path) -> list[str]:
        onnx.save(model, folder / "model.onnx")
        feeds = feeds_for(model)
        if rename:
            feeds = {f"{name}_ids": value for name, value in feeds.items()}
        np.savez(folder / "feeds.npz", **feeds)
        argv = ["optimize", str(folder / "model.onnx"), "-o", str(folder / "fused.onnx"), "--feeds"]
        return [*argv, str(folder / "feeds.npz"), "-q", *(["--no-validate"] if no_validate else [])]

    return setup


def named_cases() -> dict[str, Setup]:
    sys.path.insert(0, str(HERE.parent / "tests" / "robustness"))
    from test_bad_models import BAD  # the malformed graphs the suite refuses, one per fault

    cases: dict[str, Setup] = {f"malformed: {name}": _model_case(model, "-q") for name, (model, _) in BAD.items()}
    cases.update(
        {
            "output: --report onto the model": _output_case(
                lambda f: str(f / "fused.onnx"), lambda f: str(f / "model.onnx")
            ),
            "output: --report onto -o": _output_case(lambda f: str(f / "fused.onnx"), lambda f: str(f / "fused.onnx")),
            "output: --report in a missing folder": _output_case(
                lambda f: str(f / "fused.onnx"), lambda f: str(f / "missing" / "r.json")
            ),
            "output: -o onto the model": _output_case(lambda f: str(f / "model.onnx")),
            **({"output: -o in a read-only folder": _output_case(_read_only)} if os.geteuid() != 0 else {}),
            "output: -o an existing folder": _output_case(lambda f: str(f)),
            "output: -o empty": _output_case(lambda f: ""),
            "output: -o under a file": _output_case(lambda f: str(f / "a_file" / "fused.onnx")),
            "output: -o a 250-character name": _output_case(lambda f: str(f / ("x" * 245 + ".onnx"))),
            "output: -o a name past the file system's limit": _output_case(lambda f: str(f / ("x" * 300 + ".onnx"))),
            "output: -o a FIFO": _output_case(_fifo),
            "output: -o a symlink": _output_case(_symlink),
            "output: -o a device": _output_case(lambda f: "/dev/null"),
            "feeds: wrong names": _feeds_case(rename=True, no_validate=False),
            "feeds: with --no-validate": _feeds_case(rename=False, no_validate=True),
            "input: missing file": lambda f: ["optimize", str(f / "none.onnx"), "-o", str(f / "o.onnx")],
            "input: a folder": lambda f: ["optimize", str(f), "-o", str(f / "o.onnx")],
            "input: empty file": _bytes_case(b""),
        }
    )
    return cases


def mutation_cases(per_base: int, garbage: int) -> dict[str, tuple[str, Setup]]:
    """name → (family, setup), drawn with fixed seeds."""
    cases: dict[str, tuple[str, Setup]] = {}
    for base, variant in BASES.items():
        model = attention_model(variant)
        data = model.SerializeToString()
        for seed in range(per_base):
            rng = random.Random(f"{base}/{seed}")
            cases[f"bytes {base} #{seed}"] = ("bytes mutated", _bytes_case(mutate_bytes(data, rng)))
            kind = rng.choice(sorted(GRAPH_MUTATIONS))
            cases[f"graph {base} #{seed} ({kind})"] = (
                f"graph: {kind}",
                _model_case(mutate_graph(model, kind, rng), "-q"),
            )
    rng = random.Random("garbage")
    for seed in range(garbage):
        cases[f"garbage #{seed}"] = ("garbage bytes", _bytes_case(rng.randbytes(rng.randint(0, 4096))))
    return cases


def outcome(run: dict) -> str:
    if run["code"] == 0:
        return "exit 0"
    if run["code"] in (1, 2) and run["one_line"]:
        return "refused in one line"
    return f"exit {run['code']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-base", type=int, default=120, help="byte and graph mutations per base block (120)")
    parser.add_argument("--garbage", type=int, default=40, help="garbage inputs (40)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows: list[dict] = []
    for name, setup in named_cases().items():
        rows.append({"case": name, "family": name.split(":")[0], **run_case(setup)})
    for name, (family, setup) in mutation_cases(args.per_base, args.garbage).items():
        rows.append({"case": name, "family": family, **run_case(setup)})
    families: dict[str, Counter] = {}
    for row in rows:
        counts = families.setdefault(row["family"], Counter())
        counts["tried"] += 1
        counts[outcome(row)] += 1
        for key in COUNTED:
            counts[key] += row[key]
    summary = {
        "inputs_tried": len(rows),
        "tracebacks": sum(r["traceback"] for r in rows),
        "internal_errors": sum(r["internal_error"] for r in rows),
        "inputs_modified": sum(r["input_modified"] for r in rows),
        "partial_outputs": sum(r["partial_output"] for r in rows),
        "outcomes": dict(Counter(outcome(r) for r in rows)),
        "families": {family: dict(counts) for family, counts in families.items()},
        "named_cases": {r["case"]: {"exit": r["code"], "message": r["message"]} for r in rows if ":" in r["case"]},
        "failures": [
            r for r in rows if r["traceback"] or r["internal_error"] or r["input_modified"] or r["partial_output"]
        ],
        "skipped": []
        if os.geteuid() != 0
        else ["output: -o in a read-only folder (run as root, who may write anywhere)"],
        "seconds": round(time.perf_counter() - start, 1),
        "command": "python experiments/robustness.py",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "robustness.json").write_text(json.dumps(summary, indent=1) + "\n")
    (RESULTS / "robustness.md").write_text(render(summary))
    print(render(summary))
    return 0 if not summary["failures"] else 1


def render(summary: dict) -> str:
    lines = [
        "# Robustness: broken inputs and unlucky paths",
        "",
        f"{summary['inputs_tried']} inputs tried (`{summary['command']}`, {summary['seconds']} s): "
        f"{summary['tracebacks']} tracebacks, {summary['internal_errors']} internal errors, "
        f"{summary['inputs_modified']} inputs modified, {summary['partial_outputs']} partial outputs.",
        "",
        "| family | tried | exit 0 | refused in one line | tracebacks | internal errors | inputs modified "
        "| partial outputs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family, c in sorted(summary["families"].items()):
        lines.append(
            f"| {family} | {c['tried']} | {c.get('exit 0', 0)} | {c.get('refused in one line', 0)} | "
            f"{c.get('traceback', 0)} | {c.get('internal_error', 0)} | {c.get('input_modified', 0)} | "
            f"{c.get('partial_output', 0)} |"
        )
    if summary["skipped"]:
        lines += ["", f"Skipped: {'; '.join(summary['skipped'])}."]
    lines += ["", "## Named cases", "", "| case | exit | what egfuse said |", "|---|---|---|"]
    for case, row in summary["named_cases"].items():
        message = row["message"].replace("|", "\\|")
        lines.append(f"| {case} | {row['exit']} | {message} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
