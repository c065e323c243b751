"""The ``egfuse`` command: ``egfuse optimize IN.onnx -o OUT.onnx``, ``egfuse demo`` and ``egfuse targets``.

Each command run, and every failure turned into one line and an exit status; the arguments themselves are read by
:mod:`egfuse.commands.cli_parser`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from importlib import resources
from pathlib import Path

from egfuse import progress
from egfuse.api import Budgets, fuse
from egfuse.commands.cli_parser import build_parser
from egfuse.errors import EgfuseError, FeedsError, UsageError
from egfuse.files.load import model_files
from egfuse.files.outputs import check_outputs, model_inputs
from egfuse.files.save import write_text
from egfuse.targets import TARGETS
from egfuse.validation.validate import DEFAULTS, Settings

DEMO_MODEL = "tiny_bert.onnx"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (FeedsError, UsageError) as err:  # a usage error, like argparse's own
        _error(f"egfuse: error: {err}", args)
        return 2
    except EgfuseError as err:
        _error(f"egfuse: error: {err}", args)
        return 1
    except KeyboardInterrupt:
        print("egfuse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `egfuse targets | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit would raise again
        return 141
    except Exception as err:  # a bug of ours: one line, the traceback on --debug; no output was published
        _error(
            f"egfuse: internal error: {type(err).__name__}: {err} — nothing was written; please report it with the "
            "traceback that --debug prints",
            args,
        )
        return 3


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return _demo(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "targets":
        return _targets()
    if args.command == "calibrate":
        return _calibrate(args)
    return _optimize(args)


def _error(line: str, args: argparse.Namespace) -> None:
    if getattr(args, "debug", False):
        traceback.print_exc()
    print(line, file=sys.stderr)


def _optimize(args: argparse.Namespace) -> int:
    if args.input.is_dir():
        return _optimize_folder(args)
    if args.jobs != 1 or args.ray:
        raise UsageError("-j/--jobs and --ray fuse a folder of models; this input is one model", path=str(args.input))
    _check_outputs(args)
    feeds = _load_feeds(args.feeds) if args.feeds else None
    if feeds is not None and args.no_validate:
        print(f"egfuse: warning: --feeds {args.feeds} is not used: --no-validate skips validation", file=sys.stderr)
    validation = Settings(args.atol, args.rtol, tuple(args.provider or DEFAULTS.providers))
    target = _profiled(args.target, args.profile, validation.providers) if args.profile else args.target
    budget = None if args.memory_budget == 0 else int(args.memory_budget * 2**30)
    with progress.status_line(sys.stderr.isatty() and not args.quiet):
        result = fuse(
            args.input,
            target=target,
            validate=not args.no_validate,
            feeds=feeds,
            shapes=args.shape,
            budgets=Budgets(validation_bytes=budget),
            rotary=not args.no_rope,
            raise_opset=not args.keep_opset,
            validation=validation,
        )
    result.save(args.output)
    if args.report:
        _write_text(args.report, result.report.to_json() + "\n")
    if not args.quiet:
        print(result.report)
        print(f"wrote {args.output}" + (f" and {args.report}" if args.report else ""))
    loud = result.report.loud_note()
    if loud:  # also on stderr, and even with --quiet: a silent "unchanged" is the failure users complain about
        print(f"egfuse: note: {loud}", file=sys.stderr)
    return 0 if result.report.validated is not False else 1


def _optimize_folder(args: argparse.Namespace) -> int:
    """Every model under the folder, ``--jobs`` at once (:mod:`egfuse.commands.batch`): one line each as it finishes,
    a ledger to resume from, exit 1 when any failed or did not validate."""
    from egfuse.commands.batch import Options, optimize_folder

    for flag, value in (("--report", args.report), ("--feeds", args.feeds)):
        if value is not None:
            raise UsageError(
                f"{flag} is for one model; a folder's reports go beside its fused models", path=str(args.input)
            )
    options = Options(
        target=args.target,
        validate=not args.no_validate,
        shapes=args.shape,
        rotary=not args.no_rope,
        raise_opset=not args.keep_opset,
        atol=args.atol,
        rtol=args.rtol,
        providers=tuple(args.provider or DEFAULTS.providers),
        validation_bytes=None if args.memory_budget == 0 else int(args.memory_budget * 2**30),
        profile=str(args.profile) if args.profile else None,
    )
    echo = (lambda line: None) if args.quiet else print
    outcomes = optimize_folder(args.input, args.output, options, workers=args.jobs, ray_address=args.ray, echo=echo)
    bad = [o for o in outcomes if o.status in ("failed", "crashed") or o.validated is False]
    for outcome in bad:
        print(f"egfuse: {outcome.model}: {outcome.status}: {outcome.message}", file=sys.stderr)
    return 1 if bad else 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Before the long run: no output may be an input (the model, its weights, --feeds, --profile) or another
    output, or anything but a regular file in a folder that exists and is writable."""
    flags = (("--feeds", args.feeds), ("--profile", args.profile))
    inputs = {**model_inputs(model_files(args.input)), **{p: f"the {flag} input" for flag, p in flags if p}}
    check_outputs({"the fused model (-o)": args.output, "the report (--report)": args.report}, inputs)


def _demo(args: argparse.Namespace) -> int:
    model = resources.files("egfuse") / "data" / DEMO_MODEL
    with resources.as_file(model) as path, progress.status_line(sys.stderr.isatty() and not args.quiet):
        result = fuse(path, target=args.target)
    result.report.source = f"bundled demo model ({DEMO_MODEL}: tiny random BERT, 2 layers, dynamo export)"
    if not args.quiet:
        print(result.report)
    if args.output:
        result.save(args.output)
        if not args.quiet:
            print(f"wrote {args.output}")
    return 0 if result.report.validated else 1


def _explain(args: argparse.Namespace) -> int:
    from egfuse.commands.explain import explain, load_report

    print(explain(load_report(args.report), args.region))
    return 0


def _targets() -> int:
    width = max(len(name) for name in TARGETS)
    for name, spec in TARGETS.items():
        ops = sorted({op.label for op in spec.ops})
        print(f"{name:<{width}}  {spec.description}")
        print(f"{'':<{width}}  writes: {', '.join(ops)}")
    return 0


def _profiled(name: str, path: Path, providers: tuple[str, ...]) -> object:
    """The target as priced for the first provider it has a variant for (``--provider``: a CUDA profile refits
    the CUDA variant, with the ops CUDA runs and its choices), refitted by the profile at ``path``."""
    from egfuse.commands.profiles import profiled_target

    try:
        return profiled_target(name, path, providers)
    except ValueError as err:
        raise EgfuseError(str(err).removeprefix(f"{path}: "), path=str(path)) from None


def _calibrate(args: argparse.Namespace) -> int:
    import onnxruntime

    from egfuse.commands.calibrate import calibrate
    from egfuse.targets import get_target

    if args.provider not in onnxruntime.get_available_providers():
        have = ", ".join(onnxruntime.get_available_providers())
        raise UsageError(f"execution provider {args.provider} is not in this onnxruntime (it has: {have})")
    print(f"egfuse: timing every form target {args.target} can write, on this machine's {args.provider} …")
    spec = get_target(args.target)
    profile, _ = calibrate(spec, quick=args.quick, rounds=7 if args.quick else 15, provider=args.provider)
    _write_text(args.output, json.dumps(profile, indent=1) + "\n")
    print(f"wrote {args.output}: use it with `egfuse optimize --target {args.target} --profile {args.output}`")
    return 0


def _load_feeds(path: Path) -> dict:
    import numpy as np

    if not path.is_file():
        raise EgfuseError("no such file", path=str(path))
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as err:
        raise EgfuseError(f"not a readable .npz of inputs: {err}", path=str(path)) from None


def _write_text(path: Path, text: str) -> None:
    """Atomically (the old file or the new one), refusing a path that is not a regular file."""
    write_text(path, text)


if __name__ == "__main__":
    sys.exit(main())
