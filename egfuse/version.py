"""The version, written once: the package metadata (pyproject's dynamic version), ``egfuse --version``, the
report and the fused model's ``producer_version`` all read it here."""

__version__ = "0.1.0"
