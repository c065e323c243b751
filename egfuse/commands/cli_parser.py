"""The ``egfuse`` command's arguments: every subcommand, flag and help text, and the checks of each value's form.

Apart from :mod:`egfuse.commands.cli`, which runs the commands: what a user may type is read in one place, and running
it never needs to know how it was spelled.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from egfuse.targets import TARGETS
from egfuse.version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``optimize``, ``demo``, ``targets``, ``explain`` and ``calibrate``, ``--debug`` before or
    after the command."""
    parser = argparse.ArgumentParser(
        prog="egfuse",
        description="Fuse attention in ONNX models by equality saturation, proven on onnxruntime.",
    )
    parser.add_argument("--version", action="version", version=f"egfuse {__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, also print the traceback")
    common = argparse.ArgumentParser(add_help=False)  # --debug after the command too
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_optimize(sub, common)
    demo = sub.add_parser("demo", parents=[common], help="fuse the tiny BERT bundled with egfuse and print the report")
    demo.add_argument("--target", choices=list(TARGETS), default="ort")
    demo.add_argument("-o", "--output", type=Path, help="also write the fused demo model here")
    demo.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    sub.add_parser("targets", parents=[common], help="list the hardware targets and what each writes")
    exp = sub.add_parser(
        "explain", parents=[common], help="print one region's proof from a report (`optimize --report`)"
    )
    exp.add_argument("report", type=Path, help="the report (JSON) written by `egfuse optimize --report`")
    exp.add_argument("region", help="the region's index, softmax node name or output name")
    _add_calibrate(sub, common)
    return parser


def _add_optimize(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    opt = sub.add_parser("optimize", parents=[common], help="fuse the attention blocks of a model")
    opt.add_argument("input", type=Path, help="the .onnx model to fuse, or a folder of them (fused into -o's folder)")
    opt.add_argument("-o", "--output", type=Path, required=True, help="where to write the fused model (or folder)")
    opt.add_argument(
        "-j", "--jobs", type=_positive, default=1, metavar="N", help="for a folder: models fused at once (1)"
    )
    opt.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="for a folder: fuse on this Ray cluster ('auto': the one this machine is in; pip install 'egfuse[ray]')",
    )
    opt.add_argument(
        "--target",
        choices=list(TARGETS),
        default="ort",
        help=f"hardware target ({', '.join(TARGETS)}; see `egfuse targets`)",
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
    opt.add_argument("--no-rope", action="store_true", help="leave rotary embeddings as the graph wrote them")
    opt.add_argument(
        "--keep-opset",
        action="store_true",
        help="never raise the model's opset (ort: contrib ops only; the onnx target needs opset 23)",
    )
    _add_validation(opt.add_argument_group("validation"))
    opt.add_argument("--profile", type=Path, help="a cost profile measured by `egfuse calibrate` (default: bundled)")


def _add_validation(check: argparse._ArgumentGroup) -> None:
    check.add_argument("--atol", type=_non_negative, default=1e-4, help="absolute tolerance, float32 (1e-4)")
    check.add_argument("--rtol", type=_non_negative, default=1e-3, help="relative tolerance, float32 (1e-3)")
    check.add_argument(
        "--provider",
        action="append",
        metavar="NAME",
        help="onnxruntime execution provider the model will run on, in order (default CPUExecutionProvider): "
        "validation runs there when this onnxruntime has it, and the ort target's forms are priced for it "
        "(CUDAExecutionProvider: costs measured on an H100)",
    )
    check.add_argument(
        "--memory-budget",
        type=_non_negative,
        default=4.0,
        metavar="GB",
        help="the most memory a validation run may hold (GiB, estimated before it runs; 0: no limit)",
    )


def _add_calibrate(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    cal = sub.add_parser(
        "calibrate", parents=[common], help="time each form on this machine's onnxruntime and fit a cost profile"
    )
    cal.add_argument("--target", choices=list(TARGETS), default="ort")
    cal.add_argument("-o", "--output", type=Path, required=True, help="where to write the profile (JSON)")
    cal.add_argument("--quick", action="store_true", help="a smaller grid of shapes and fewer runs (~1 min)")
    cal.add_argument(
        "--provider",
        default="CPUExecutionProvider",
        metavar="NAME",
        help="the onnxruntime execution provider to time on (CUDAExecutionProvider with onnxruntime-gpu)",
    )


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _shape_binding(text: str) -> dict[str, int]:
    binding = {}
    for item in filter(None, text.split(",")):
        name, _, size = item.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=SIZE with a positive integer size")
        binding[name.strip()] = int(size)
    return binding
