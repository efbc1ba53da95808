"""Training configuration: named recipes, a JSON config file, and flags.

The model's hyperparameters (`model`, passed to `Transformer.from_preset`) stay
apart from the run settings (data, tokenizer, batching, schedule, outputs).
Later sources override earlier ones: recipe, then config file, then flags.
"""

import dataclasses
import json
import os

from keras_transformer.models.presets import PRESETS
from pipelines.data.default_corpus import DEFAULT_SIZES
from pipelines.errors import ConfigError
from pipelines.training.recipes import RECIPES

CORPORA = ("default", "multi30k", "files", "tfds")
MODEL_SIZES = ("num_layers", "hidden_dim", "intermediate_dim", "num_heads")


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
    default_corpus_sizes: list = dataclasses.field(default_factory=lambda: list(DEFAULT_SIZES))
    # Tokenizer and batching.
    vocabulary_size: int = 8000
    batch_tokens: int = 4096
    max_length: int = 128
    # BPE-dropout on the training pairs (`batching.sampled_examples`): the
    # probability of skipping a merge (0: off) and the sampled copies of the
    # corpus made before training.
    subword_sampling: float = 0.0
    subword_copies: int = 4
    # Model: a preset plus overrides of its arguments, or no preset and every
    # size argument in `model`.
    preset: str | None = "transformer_small"
    model: dict = dataclasses.field(default_factory=dict)
    # Optimization. `steps` may be None with `max_minutes`: as many as fit.
    steps: int | None = 10000
    steps_per_epoch: int = 1000
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    # The fraction of the run over which the rate falls linearly to 0
    # (`TransformerSchedule`); 0 keeps eq. (3).
    cooldown: float = 0.0
    label_smoothing: float = 0.1
    accumulation_steps: int = 1
    mixed_precision: str | None = None  # "mixed_bfloat16" or "mixed_float16"
    xla: bool = False
    # Outputs.
    output_dir: str = "runs/default"
    backup_every: int = 100
    early_stopping_patience: int | None = None
    # A wall-clock budget that sets the run's length (`TimeBudget`), keeping
    # `reserve_minutes` of it for averaging and evaluation.
    max_minutes: float | None = None
    reserve_minutes: float = 2.0
    average_last: int = 1
    seed: int = 0

    def validate(self):
        """Raises `ConfigError` naming the first bad setting."""
        if self.corpus not in CORPORA:
            raise ConfigError(f"Unknown corpus {self.corpus!r}; expected one of {list(CORPORA)}")
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigError(f"Unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        missing = [name for name in MODEL_SIZES if name not in self.model_arguments(1)]
        if missing:
            raise ConfigError(f"With no preset, model needs {missing} (--set model.NAME=VALUE)")
        if self.corpus == "multi30k" and not self.multi30k_dir:
            raise ConfigError("corpus 'multi30k' needs multi30k_dir (--multi30k-dir)")
        if self.corpus == "files" and not self.train_files:
            raise ConfigError("corpus 'files' needs train_files (--train-files SOURCE TARGET)")
        if self.corpus == "tfds" and not self.tfds_name:
            raise ConfigError("corpus 'tfds' needs tfds_name (--tfds NAME)")
        if self.steps is None and not self.max_minutes:
            raise ConfigError("steps may be left out (null) only with max_minutes")
        for name in (
            "steps_per_epoch",
            "batch_tokens",
            "max_length",
            "accumulation_steps",
            "subword_copies",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} must be positive. Received: {name}={getattr(self, name)}"
                )
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps must be positive. Received: steps={self.steps}")
        if self.max_minutes is not None and self.max_minutes <= self.reserve_minutes:
            raise ConfigError(
                f"max_minutes must be more than reserve_minutes ({self.reserve_minutes}). "
                f"Received: max_minutes={self.max_minutes}"
            )
        if not 0.0 <= self.subword_sampling < 1.0:
            raise ConfigError(
                f"subword_sampling must be in [0, 1). Received: "
                f"subword_sampling={self.subword_sampling}"
            )
        if not 0.0 <= self.cooldown <= 1.0:
            raise ConfigError(f"cooldown must be in [0, 1]. Received: cooldown={self.cooldown}")
        if self.batch_tokens < self.max_length:
            raise ConfigError(
                f"batch_tokens ({self.batch_tokens}) must be at least "
                f"max_length ({self.max_length})"
            )
        return self

    def model_arguments(self, vocabulary_size):
        """Arguments for `Transformer(**arguments)`: the preset's, then `model`'s."""
        preset = PRESETS[self.preset] if self.preset else {}
        return {"vocabulary_size": vocabulary_size, **preset, **self.model}

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def _merge(config, values, origin):
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    # A preset set here replaces the model of earlier sources; `model` set
    # here (applied after it) still overrides the new preset's arguments.
    for key, value in sorted(values.items(), key=lambda item: item[0] != "preset"):
        if key not in fields:
            raise ConfigError(f"Unknown setting {key!r} in {origin}")
        if key == "preset" and value != config.preset:
            config.model = {}
        if key == "model":
            value = {**config.model, **value}
        setattr(config, key, value)
    return config


def load_config(recipe="default", config_file=None, overrides=None, settings=None):
    """Builds a `TrainConfig` from a recipe, a JSON file and flag overrides.

    Args:
        recipe: str, a name in `RECIPES`.
        config_file: str or None, a JSON object of `TrainConfig` fields.
        overrides: dict or None, fields set from flags; None values are
            ignored (a flag not given).
        settings: dict or None, fields set last (`--set KEY=VALUE`); a None
            value sets the field to None (`--set steps=null`).

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
    config = _merge(config, overrides, "flags")
    return _merge(config, settings or {}, "--set").validate()


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
