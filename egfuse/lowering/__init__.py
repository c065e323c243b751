"""ONNX -> egglog terms: each op of a region as the term the rules reason about (layouts, reshapes read through
symbolic shapes, heads in groups, pieces and joins), opaque leaves for the rest."""
