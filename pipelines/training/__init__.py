"""Training configuration and recipes, the distributed run, the Trainer, checkpoints."""
