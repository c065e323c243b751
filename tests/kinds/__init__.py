"""One file per region kind (:mod:`egfuse.kinds`): its regions found, written, checked on onnxruntime, and explained
when missed."""
