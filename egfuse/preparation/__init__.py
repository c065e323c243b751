"""The model made searchable before any region is found: the opset raised where the target needs it, shapes
inferred, model-local functions inlined, and what hides ops from the rules folded (known Ifs, integer literals,
sequence ops)."""
