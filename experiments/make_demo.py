"""Build the demo model bundled with egfuse: a tiny random BERT (2 layers, hidden 32, SDPA attention),
exported with ``torch.onnx.export(dynamo=True)``. Needs the ``corpus`` extra.

    python experiments/make_demo.py          # writes egfuse/data/tiny_bert.onnx
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import corpus

OUT = Path(__file__).parent.parent / "egfuse" / "data" / "tiny_bert.onnx"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        entry = corpus.export(corpus.SPECS["bert_sdpa"], "dynamo", Path(tmp))
        if entry.error:
            print(f"export failed: {entry.error}", file=sys.stderr)
            return 1
        OUT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / entry.file, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
