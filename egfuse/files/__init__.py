"""Reading and writing model files: a model read with its checks (weights outside the file kept there), outputs
checked before anything is written, the result published atomically, large weights detached while egfuse works."""
