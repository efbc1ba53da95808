"""Training configuration: named recipes, a JSON config file, and flags.

The model's hyperparameters (`model`, passed to `Transformer.from_preset`) stay
apart from the run settings (data, tokenizer, batching, schedule, outputs).
Later sources override earlier ones: recipe, then config file, then flags.
"""

import dataclasses
import json
import os

from keras_transformer.models.presets import PRESETS

CORPORA = ("default", "multi30k", "files", "tfds")


class ConfigError(ValueError):
    """A configuration that names something unknown or inconsistent."""


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run needs. See `RECIPES` for worked examples."""

    # Data.
    corpus: str = "default"
    multi30k_dir: str | None = None
    source_language: str = "en"
    target_language: str = "de"
    train_files: list | None = None  # [source, target]
    validation_files: list | None = None  # [source, target]
    tfds_name: str | None = None
    tfds_data_dir: str | None = None
    tfds_train_split: str = "train"
    tfds_validation_split: str = "validation"
    target_locale: str = "de"
    default_corpus_sizes: list = dataclasses.field(default_factory=lambda: [20000, 500, 500])
    # Tokenizer and batching.
    vocabulary_size: int = 8000
    batch_tokens: int = 4096
    max_length: int = 128
    # Model: a preset plus overrides of its arguments.
    preset: str = "transformer_small"
    model: dict = dataclasses.field(default_factory=dict)
    # Optimization.
    steps: int = 10000
    steps_per_epoch: int = 1000
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    label_smoothing: float = 0.1
    accumulation_steps: int = 1
    mixed_precision: str | None = None  # "mixed_bfloat16" or "mixed_float16"
    xla: bool = False
    # Outputs.
    output_dir: str = "runs/default"
    backup_every: int = 100
    early_stopping_patience: int | None = None
    max_minutes: float | None = None  # stop after the last epoch that fits
    average_last: int = 1
    seed: int = 0

    def validate(self):
        """Raises `ConfigError` naming the first bad setting."""
        if self.corpus not in CORPORA:
            raise ConfigError(f"Unknown corpus {self.corpus!r}; expected one of {list(CORPORA)}")
        if self.preset not in PRESETS:
            raise ConfigError(f"Unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        if self.corpus == "multi30k" and not self.multi30k_dir:
            raise ConfigError("corpus 'multi30k' needs multi30k_dir (--multi30k-dir)")
        if self.corpus == "files" and not self.train_files:
            raise ConfigError("corpus 'files' needs train_files (--train-files SOURCE TARGET)")
        if self.corpus == "tfds" and not self.tfds_name:
            raise ConfigError("corpus 'tfds' needs tfds_name (--tfds NAME)")
        for name in (
            "steps",
            "steps_per_epoch",
            "batch_tokens",
            "max_length",
            "accumulation_steps",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} must be positive. Received: {name}={getattr(self, name)}"
                )
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"max_minutes must be positive. Received: {self.max_minutes}")
        if self.batch_tokens < self.max_length:
            raise ConfigError(
                f"batch_tokens ({self.batch_tokens}) must be at least "
                f"max_length ({self.max_length})"
            )
        return self

    def model_arguments(self, vocabulary_size):
        """Arguments for `Transformer.from_preset(self.preset, **arguments)`."""
        return {"vocabulary_size": vocabulary_size, **self.model}

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


RECIPES = {
    # Trains with no arguments on the embedded CLDR corpus in minutes on a CPU.
    "default": {
        "corpus": "default",
        "vocabulary_size": 500,
        "batch_tokens": 1024,
        "max_length": 64,
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
    # Multi30k task 1 (29,000 pairs) within 60 minutes on a 2-core CPU: 15
    # epochs. A 4-layer width-128 model (Wu et al., 2021, "Transformer-Tiny")
    # is what 2 cores can train that often; in so few epochs it underfits
    # rather than overfits, so dropout stays at 0.1, and the learning rate
    # peaks at 0.0022 after a short warmup. The last 5 checkpoints are averaged.
    "multi30k": {
        "corpus": "multi30k",
        "vocabulary_size": 8000,
        "batch_tokens": 4096,
        "max_length": 100,
        "model": {
            "num_layers": 4,
            "hidden_dim": 128,
            "intermediate_dim": 256,
            "num_heads": 4,
            "dropout": 0.1,
        },
        "steps": 1500,
        "steps_per_epoch": 100,
        "warmup_steps": 400,
        "learning_rate_scale": 0.5,
        "output_dir": "runs/multi30k",
        "average_last": 5,
        # 46 minutes here; on a slower machine, stop while averaging and the
        # test-set evaluation still fit in the hour.
        "max_minutes": 57,
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


def _merge(config, values, origin):
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"Unknown setting {key!r} in {origin}")
        if key == "model":
            value = {**config.model, **value}
        setattr(config, key, value)
    return config


def load_config(recipe="default", config_file=None, overrides=None):
    """Builds a `TrainConfig` from a recipe, a JSON file and flag overrides.

    Args:
        recipe: str, a name in `RECIPES`.
        config_file: str or None, a JSON object of `TrainConfig` fields.
        overrides: dict or None, fields set last (from flags); None values are
            ignored.

    Returns:
        a validated `TrainConfig`.
    """
    if recipe not in RECIPES:
        raise ConfigError(f"Unknown recipe {recipe!r}; expected one of {sorted(RECIPES)}")
    config = _merge(TrainConfig(), RECIPES[recipe], f"recipe {recipe!r}")
    if config_file:
        if not os.path.exists(config_file):
            raise ConfigError(f"Config file not found: {config_file}")
        try:
            with open(config_file, encoding="utf-8") as handle:
                values = json.load(handle)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{config_file}: not valid JSON ({error})") from None
        config = _merge(config, values, config_file)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    return _merge(config, overrides, "flags").validate()


def add_run_arguments(parser):
    """Adds `--run-dir`, `--model` and `--sentencepiece` to a command's parser."""
    parser.add_argument("--run-dir", help="a training output folder (model.keras, ...)")
    parser.add_argument("--model", help="a .keras file; defaults to RUN_DIR/model.keras")
    parser.add_argument("--sentencepiece", help="defaults to RUN_DIR/sentencepiece.model")


def run_files(args):
    """`(model_path, sentencepiece_path)` from `add_run_arguments` flags.

    Raises:
        ConfigError: naming the file that does not exist.
    """
    run_dir = args.run_dir or ""
    model_path = args.model or os.path.join(run_dir, "model.keras")
    spm_path = args.sentencepiece or os.path.join(run_dir, "sentencepiece.model")
    for label, path in (("model", model_path), ("SentencePiece model", spm_path)):
        if not os.path.isfile(path):
            raise ConfigError(
                f"{label} not found: {path} (give --run-dir or --model/--sentencepiece)"
            )
    return model_path, spm_path


def max_source_length(args):
    """`--max-source-length`, else the run's `max_length` from RUN_DIR/config.json.

    Raises:
        ConfigError: when neither gives a length of at least 2.
    """
    length = args.max_source_length
    config_path = os.path.join(args.run_dir or "", "config.json")
    if length is None and os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as handle:
            length = json.load(handle)["max_length"]
    if not length or length < 2:
        raise ConfigError(f"--max-source-length must be at least 2. Received: {length}")
    return length
