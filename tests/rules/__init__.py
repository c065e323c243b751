"""One file per rule family (rules/): the identities proven in a saturated e-graph and the spellings they fuse, checked
on onnxruntime."""
