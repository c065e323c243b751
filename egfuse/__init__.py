"""egfuse: attention fusion for ONNX graphs by equality saturation.

>>> import egfuse
>>> result = egfuse.fuse("model.onnx", target="ort")   # doctest: +SKIP
>>> print(result.report); result.save("model.fused.onnx")   # doctest: +SKIP
"""

from egfuse.api import Budgets, FuseResult, fuse
from egfuse.errors import EgfuseError
from egfuse.targets import targets
from egfuse.version import __version__

__all__ = ["Budgets", "EgfuseError", "FuseResult", "__version__", "fuse", "targets"]
