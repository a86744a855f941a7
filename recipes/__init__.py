"""Bundled training recipes (YAML): the training protocol of one paper on one benchmark."""
