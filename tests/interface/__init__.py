"""What a user touches: the Python API, the CLI, folders of models, the house rules and the paper's generated tables."""
