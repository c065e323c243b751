"""The egfuse command and its jobs: the CLI, folders of models fused at once, a region's proof printed, a target
calibrated on this machine."""
