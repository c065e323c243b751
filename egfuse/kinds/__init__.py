"""Region kinds: what the search finds, lowers and writes as one fused op each — attention, a layer's norms and
activations, rotations — and explains when it stays as written. The registry is :mod:`egfuse.kinds.registry`
(kept apart, so that importing a kind's shared pieces, :mod:`egfuse.kinds.regions`, runs no kind)."""
