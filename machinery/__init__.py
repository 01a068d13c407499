"""The machinery around the reader's files, a module a concern: the commands' front door, options, devices, the
prepared data read back, a run's state, checkpoint files, the run log, the training step, tokenizers, nanoGPT's
checkpoints and what a measurement records (README.md's layout)."""
