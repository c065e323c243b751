"""The judge: faults injected and caught, half-precision judging, fills and large scores."""
