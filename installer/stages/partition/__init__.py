"""The partition stage: split GPUs into MIG instances as the node's config asks (issue 26)."""
