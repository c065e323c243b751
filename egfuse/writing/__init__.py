"""The extraction written back as ONNX: the emitter and one writer per kind of fused op (standard, contrib,
single-head, norms, GELU, rotary), the masks a fused op is given, a KV cache absorbed, what was fused away cleaned
up."""
