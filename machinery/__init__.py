"""The machinery around the reader's files: options, devices, checkpoints, the run log, the training step,
tokenizers, nanoGPT's checkpoints, and the batch-invariant mode with its kernels (README.md's layout)."""
