"""Checkpoints and weights: orbax (async, keep-N, atomic, resume), run directories (the trained
model of a workdir, a step or an export), and weights in and out (.npz, timm, Hugging Face)."""
