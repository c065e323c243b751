"""Real exports and corpora: Hugging Face models, the exporter-drift corpus, other producers, held-out and half-
precision models."""
