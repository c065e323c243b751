"""The search's stages and the analyses they read: facts, lowering, repeats, certificates, targets and providers."""
