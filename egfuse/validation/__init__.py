"""The judge: original and fused models run on onnxruntime on generated (or the user's) feeds that exercise masks,
padding and caches, every fused region's output compared with tolerances per dtype; what to roll back."""
