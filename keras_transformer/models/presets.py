"""Named hyperparameter sets for `Transformer.from_preset`."""

# Table 3 of the paper; `transformer_small` is sized for training on a CPU.
PRESETS = {
    "transformer_base": {
        "num_layers": 6,
        "hidden_dim": 512,
        "intermediate_dim": 2048,
        "num_heads": 8,
        "dropout": 0.1,
    },
    "transformer_big": {
        "num_layers": 6,
        "hidden_dim": 1024,
        "intermediate_dim": 4096,
        "num_heads": 16,
        "dropout": 0.3,
    },
    "transformer_small": {
        "num_layers": 3,
        "hidden_dim": 256,
        "intermediate_dim": 1024,
        "num_heads": 4,
        "dropout": 0.1,
    },
}
