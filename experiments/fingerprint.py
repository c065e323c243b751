"""What an experiment's cached outcomes depend on: egfuse's and the rules' sources and the versions of the
packages that run them. A cache entry (a variant's outcome, a fused model on disk) is reused only while this
fingerprint is unchanged, so a result is never measured on code older than the commit it is reported at."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "missing"


def source_fingerprint(packages: tuple[str, ...] = ("egglog", "onnx", "onnx-ir", "onnxruntime")) -> str:
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "egfuse").rglob("*.py"), *(REPO / "rules").glob("*.py")]):
        digest.update(str(path.relative_to(REPO)).encode() + path.read_bytes())
    for package in packages:
        digest.update(f"{package}={package_version(package)}".encode())
    return digest.hexdigest()[:16]
