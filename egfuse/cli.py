"""The ``egfuse`` command: ``egfuse optimize IN.onnx -o OUT.onnx``, ``egfuse demo`` and ``egfuse targets``."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from egfuse.api import fuse
from egfuse.errors import EgfuseError
from egfuse.targets import TARGETS

DEMO_MODEL = "tiny_bert.onnx"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egfuse",
        description="Fuse attention in ONNX models by equality saturation, proven on onnxruntime.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    targets = ", ".join(TARGETS)

    opt = sub.add_parser("optimize", help="fuse the attention blocks of a model")
    opt.add_argument("input", type=Path, help="the .onnx model to fuse")
    opt.add_argument("-o", "--output", type=Path, required=True, help="where to write the fused model")
    opt.add_argument(
        "--target", choices=list(TARGETS), default="ort", help=f"hardware target ({targets}; see `egfuse targets`)"
    )
    opt.add_argument(
        "--shape",
        type=_shape_binding,
        metavar="NAME=SIZE,…",
        help="sizes to choose the fastest form for: a symbolic dim's name or a word in it (seq=512,past=1024,"
        "batch=8); unbound dims take typical sizes (batch 1, past 256, others 128)",
    )
    opt.add_argument("--report", type=Path, help="also write the report as JSON here")
    opt.add_argument("--no-validate", action="store_true", help="skip the onnxruntime check (not recommended)")
    opt.add_argument("--feeds", type=Path, help="inputs for the onnxruntime check (.npz, one array per graph input)")
    opt.add_argument("-q", "--quiet", action="store_true", help="print only errors")

    demo = sub.add_parser("demo", help="fuse the tiny BERT bundled with egfuse and print the report")
    demo.add_argument("--target", choices=list(TARGETS), default="ort")
    demo.add_argument("-o", "--output", type=Path, help="also write the fused demo model here")

    opt.add_argument("--profile", type=Path, help="a cost profile measured by `egfuse calibrate` (default: bundled)")

    sub.add_parser("targets", help="list the hardware targets and what each writes")

    cal = sub.add_parser("calibrate", help="time each form on this machine's onnxruntime and fit a cost profile")
    cal.add_argument("--target", choices=list(TARGETS), default="ort")
    cal.add_argument("-o", "--output", type=Path, required=True, help="where to write the profile (JSON)")
    cal.add_argument("--quick", action="store_true", help="a smaller grid of shapes and fewer runs (~1 min)")
    return parser


def _shape_binding(text: str) -> dict[str, int]:
    binding = {}
    for item in filter(None, text.split(",")):
        name, _, size = item.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=SIZE with a positive integer size")
        binding[name.strip()] = int(size)
    return binding


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "targets":
            return _targets()
        if args.command == "calibrate":
            return _calibrate(args)
        return _optimize(args)
    except EgfuseError as err:
        print(f"egfuse: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("egfuse: interrupted", file=sys.stderr)
        return 130


def _optimize(args: argparse.Namespace) -> int:
    if args.output.resolve() == args.input.resolve():
        raise EgfuseError("refusing to overwrite the input model; choose another -o", path=str(args.output))
    feeds = _load_feeds(args.feeds) if args.feeds else None
    target = _profiled(args.target, args.profile) if args.profile else args.target
    result = fuse(args.input, target=target, validate=not args.no_validate, feeds=feeds, shapes=args.shape)
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


def _demo(args: argparse.Namespace) -> int:
    model = resources.files("egfuse") / "data" / DEMO_MODEL
    with resources.as_file(model) as path:
        result = fuse(path, target=args.target)
    result.report.source = f"bundled demo model ({DEMO_MODEL}: tiny random BERT, 2 layers, dynamo export)"
    print(result.report)
    if args.output:
        result.save(args.output)
        print(f"wrote {args.output}")
    return 0 if result.report.validated else 1


def _targets() -> int:
    width = max(len(name) for name in TARGETS)
    for name, spec in TARGETS.items():
        ops = sorted({op.label for op in spec.ops})
        print(f"{name:<{width}}  {spec.description}")
        print(f"{'':<{width}}  writes: {', '.join(ops)}")
    return 0


def _profiled(name: str, path: Path) -> object:
    from egfuse.calibrate import apply_profile, load_profile
    from egfuse.targets import get_target

    try:
        return apply_profile(get_target(name), load_profile(path))
    except ValueError as err:
        raise EgfuseError(str(err).removeprefix(f"{path}: "), path=str(path)) from None


def _calibrate(args: argparse.Namespace) -> int:
    from egfuse.calibrate import calibrate
    from egfuse.targets import get_target

    print(f"egfuse: timing every form target {args.target} can write, on this machine's onnxruntime …")
    profile, _ = calibrate(get_target(args.target), quick=args.quick, rounds=7 if args.quick else 15)
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
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
