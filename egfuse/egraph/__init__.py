"""The e-graph and what is read from it: the language (constructors, facts), the egglog session, each e-class's
shape, the cost model and the extractor, the forms a class held, and each fused region's certificate."""
