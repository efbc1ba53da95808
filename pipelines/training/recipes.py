"""Named training recipes: `TrainConfig` fields a run starts from (`--recipe NAME`).

Each recipe records the model it trains: a preset (`base`, `big`), or no
preset and every size argument of `Transformer` (`default`, `multi30k`), so
that a run's config.json says what the model is.
"""

RECIPES = {
    # Trains with no arguments on the embedded CLDR corpus in minutes on a CPU.
    "default": {
        "corpus": "default",
        "vocabulary_size": 500,
        "batch_tokens": 1024,
        "max_length": 64,
        "preset": None,
        "model": {
            "num_layers": 2,
            "hidden_dim": 128,
            "intermediate_dim": 512,
            "num_heads": 4,
            "dropout": 0.1,
        },
        "steps": 1600,
        "steps_per_epoch": 200,
        "warmup_steps": 300,
        "learning_rate_scale": 0.5,
        "average_last": 3,
        "output_dir": "runs/default",
    },
    # Multi30k task 1 (29,000 pairs) within 60 minutes on a 2-core CPU, given
    # in minutes: the run takes as many updates as fit in `max_minutes`, and
    # the rate falls to 0 over the last `cooldown` of them. A 4-layer
    # width-128 model (Wu et al., 2021, "Transformer-Tiny") is what 2 cores
    # can train that often. Chosen on val (benchmarks/results/recipe_study.json,
    # recipe_val_*.json): pre-norm, which trains stably at twice the
    # post-norm peak rate (0.0044 after a 400-update warmup) and scored 38.68
    # val BLEU (beam 4) after 57 minutes against 37.47 for post-norm at
    # 0.0022; 8,000 pieces (4,000: more updates, 38.37); dropout 0.1, since
    # in so few epochs the model underfits; batches of 2,048 tokens a side,
    # which at one budget beat 4,096 (fewer updates) and 1,024 (noisier
    # ones). The last 5 checkpoints are averaged.
    "multi30k": {
        "corpus": "multi30k",
        "vocabulary_size": 8000,
        "batch_tokens": 2048,
        "max_length": 100,
        "preset": None,
        "model": {
            "num_layers": 4,
            "hidden_dim": 128,
            "intermediate_dim": 256,
            "num_heads": 4,
            "dropout": 0.1,
            "normalize_first": True,
        },
        "steps": None,
        "max_minutes": 57,
        "reserve_minutes": 0.75,
        "cooldown": 0.3,
        "steps_per_epoch": 200,
        "warmup_steps": 400,
        "learning_rate_scale": 1.0,
        "output_dir": "runs/multi30k",
        "average_last": 5,
    },
    # The paper's base and big models (section 5, Table 3), 25,000-token batches.
    "base": {
        "preset": "transformer_base",
        "vocabulary_size": 37000,
        "batch_tokens": 25000,
        "max_length": 256,
        "steps": 100000,
        "steps_per_epoch": 1000,
        "warmup_steps": 4000,
        "average_last": 5,
        "output_dir": "runs/base",
    },
    "big": {
        "preset": "transformer_big",
        "vocabulary_size": 37000,
        "batch_tokens": 25000,
        "max_length": 256,
        "steps": 300000,
        "steps_per_epoch": 1000,
        "warmup_steps": 4000,
        "average_last": 20,
        "output_dir": "runs/big",
    },
}
