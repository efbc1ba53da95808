"""Training configuration: typed settings grouped by concern, recipes, one validation.

Every setting is declared once, below, as a dataclass field with its type,
default, help and limits; the `kt train` flags, the checks and the settings
table in docs/settings.md are all derived from these declarations.
`loading.load_config` applies the sources in order (recipe, config file,
flags and `--set` values); the result is checked as a whole by `validate`
before any data is read.

Dataclasses with one generic loader rather than a validation library
(pydantic, attrs): the types are few (numbers, strings, booleans, lists of
them, None), and our own checks give the one-line `error:` messages every
command promises, naming the setting and the value, without a dependency.
"""

import dataclasses
import json
import re
import typing

import keras

from keras_transformer.decoding.steps import PENALTY_FORMS
from keras_transformer.models.presets import PRESETS
from pipelines.errors import ConfigError
from pipelines.training.values import base_type, parse_scalar

CORPORA = ("default", "multi30k", "files", "tfds", "ptb")
MODEL_SIZES = ("num_layers", "hidden_dim", "intermediate_dim", "num_heads")


def setting(default, help, low=None, high=None, above=None, below=None, choices=None, nargs=None):
    """A declared setting: a dataclass field whose metadata the flags and checks read.

    Args:
        default: the value when no source sets it (a list is copied per config).
        help: str, one line for `--help` and the docs.
        low, high: inclusive limits of a number; above, below: exclusive ones.
        choices: tuple of the allowed values, or None.
        nargs: int, the values a list flag takes (e.g. 2 for SOURCE TARGET).
    """
    metadata = {"help": help, "low": low, "high": high, "above": above, "below": below}
    metadata.update({"choices": choices, "nargs": nargs})
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class DataConfig:
    """Where the training pairs come from."""

    corpus: str = setting("default", "the training corpus", choices=CORPORA)
    multi30k_dir: str | None = setting(None, "folder of Multi30k's train/val/test .gz files")
    source_language: str = setting("en", "Multi30k source language")
    target_language: str = setting("de", "Multi30k target language")
    train_files: list[str] | None = setting(
        None, "aligned SOURCE TARGET text files, one pair or several (plain or .gz)"
    )
    train_weights: list[float] | None = setting(
        None, "each train_files pair's share of the stream (null: in proportion to size)", above=0.0
    )
    validation_files: list[str] | None = setting(None, "aligned SOURCE TARGET files", nargs=2)
    tfds_name: str | None = setting(None, "a TFDS translation dataset, e.g. wmt14_translate/de-en")
    tfds_data_dir: str | None = setting(None, "TFDS data folder")
    tfds_train_split: str = setting("train", "TFDS training split")
    tfds_validation_split: str = setting("validation", "TFDS validation split")
    tfds_source_language: str | None = setting(
        None, "the TFDS language used as source (null: the dataset's supervised order)"
    )
    shard_size: int = setting(200_000, "examples a prepared training shard holds", low=1)
    target_locale: str = setting("de", "CLDR locale of the default corpus's targets")
    default_corpus_sizes: list[int] = setting(
        [20000, 500, 500], "train, validation, test sizes of the default corpus", low=1, nargs=3
    )
    treebank_dir: str | None = setting(None, "folder of Penn Treebank wsj_NNNN.mrg files (ptb)")
    treebank_pos_tags: bool = setting(False, "ptb targets keep POS tags, not the XX placeholder")
    treebank_words: bool = setting(
        False, "ptb targets write each word before its tag (the search copies it)"
    )


@dataclasses.dataclass
class BatchingConfig:
    """The tokenizer and the batches."""

    vocabulary_size: int = setting(8000, "SentencePiece pieces, shared by both sides", low=8)
    vocabulary_sample: int = setting(
        500_000, "pairs sampled from the whole training data to train the vocabulary", low=1
    )
    batch_tokens: int = setting(4096, "tokens per side of a batch", low=1)
    max_length: int = setting(
        128, "longest training sentence in pieces; longer pairs dropped", low=2
    )
    subword_sampling: float = setting(
        0.0, "BPE-dropout: probability of skipping a merge (0: off)", low=0.0, below=1.0
    )
    subword_copies: int = setting(4, "sampled segmentations of the corpus made", low=1)
    shuffle_buffer: int = setting(
        100_000, "training examples in the shuffle buffers (shared by the input streams)", low=1
    )
    input_streams: int | None = setting(
        None,
        "length-bucketing streams a worker reads at once, over disjoint shards "
        "(null: one per two cores, 1 to 16)",
        low=1,
        high=64,
    )
    data_service: str | None = setting(
        None, "a tf.data service dispatcher (grpc://HOST:PORT) whose workers run the streams"
    )
    byte_fallback: bool = setting(
        False, "characters the vocabulary lacks become UTF-8 byte pieces, not unk (SentencePiece)"
    )
    character_coverage: float = setting(
        1.0, "share of the sample's characters the vocabulary covers (SentencePiece)", above=0.0,
        high=1.0,
    )  # fmt: skip
    extend_vocabulary: int = setting(
        0, "with init_from: add the pieces a vocabulary of N trained on the new data has and "
        "the source's lacks (0: the source's vocabulary unchanged)", low=0,
    )  # fmt: skip
    whole_target_tokens: bool = setting(
        False, "each distinct space-separated target token is one piece (closed vocabularies)"
    )
    whole_source_words: int = setting(
        0, "the N most frequent training source words are one piece each (0: none)", low=0
    )
    target_vocabulary: bool = setting(
        False,
        "targets have their own SentencePiece model, sentencepiece.target.model (an imported "
        "model's; --init-from sets it)",
    )


@dataclasses.dataclass
class ModelConfig:
    """The `Transformer`: a preset, and any of its arguments (None: the preset's)."""

    preset: str | None = setting("transformer_small", "a named preset", choices=tuple(PRESETS))
    num_layers: int | None = setting(None, "layers N of the encoder and of the decoder", low=1)
    hidden_dim: int | None = setting(None, "model size d_model", low=1)
    intermediate_dim: int | None = setting(None, "feed-forward size d_ff", low=1)
    num_heads: int | None = setting(None, "attention heads h; must divide hidden_dim", low=1)
    dropout: float | None = setting(None, "residual and embedding dropout", low=0.0, below=1.0)
    attention_dropout: float | None = setting(
        None, "dropout on attention probabilities", low=0.0, below=1.0
    )
    activation_dropout: float | None = setting(
        None, "dropout on the feed-forward's inner activations", low=0.0, below=1.0
    )
    activation: str | None = setting(None, "feed-forward activation (a Keras name)")
    layer_norm_epsilon: float | None = setting(None, "LayerNorm epsilon", above=0.0, high=1.0)
    normalize_first: bool | None = setting(None, "pre-norm layers instead of post-norm")
    share_source_target_embeddings: bool | None = setting(None, "one source/target embedding")
    tie_output_embeddings: bool | None = setting(None, "target embedding as output projection")
    learned_positions: bool | None = setting(None, "learned positions instead of sinusoids")
    max_positions: int | None = setting(None, "positions a learned table covers", low=1)
    sinusoid_layout: str | None = setting(
        None, "sines and cosines interleaved (the paper's) or concatenated (Marian's)",
        choices=("interleaved", "concatenated"),
    )  # fmt: skip
    output_bias: bool | None = setting(None, "a learned bias on the tied output logits")
    init_from: str | None = setting(
        None, "a run folder or .keras file to start from: its architecture, vocabulary, weights"
    )


@dataclasses.dataclass
class OptimizationConfig:
    """Steps, schedule, loss and numerics."""

    steps: int | None = setting(
        10000, "optimizer steps; null with max_minutes: as many as fit", low=1
    )
    steps_per_epoch: int = setting(
        1000, "steps between validations (and checkpoints, without checkpoint_minutes)", low=1
    )
    warmup_steps: int = setting(4000, "warm-up steps of eq. (3)", low=1)
    learning_rate_scale: float = setting(1.0, "multiplier on eq. (3)", above=0.0)
    cooldown: float = setting(
        0.0, "fraction of the run over which the rate falls to 0", low=0.0, high=1.0
    )
    label_smoothing: float = setting(0.1, "label smoothing epsilon_ls", low=0.0, below=1.0)
    accumulation_steps: int = setting(1, "micro-batches per optimizer step", low=1)
    mixed_precision: str | None = setting(
        None, "a mixed precision policy", choices=("mixed_bfloat16", "mixed_float16")
    )
    xla: bool = setting(False, "compile the train step with XLA")
    seed: int = setting(0, "random seed of data order, initialization and dropout", low=0)
    ema: float | None = setting(
        None,
        "decay of an exponential moving average of the weights (0.9999; null: none)",
        above=0.0,
        below=1.0,
    )


@dataclasses.dataclass
class BudgetConfig:
    """A wall-clock budget that sets the run's length (`TimeBudget`)."""

    max_minutes: float | None = setting(None, "the run ends inside this many minutes", above=0.0)
    reserve_minutes: float = setting(2.0, "minutes kept for averaging and evaluation", low=0.0)


@dataclasses.dataclass
class OutputConfig:
    """What the run writes and keeps."""

    output_dir: str = setting("runs/default", "the run's folder")
    backup_every: int = setting(100, "steps between resumable backups", low=1)
    checkpoint_minutes: float | None = setting(
        None, "minutes between checkpoints (the paper's 10; null: one each epoch)", above=0.0
    )
    keep_checkpoints: int | None = setting(
        None, "checkpoints kept (those averaging reads and the best kept too; null: all)", low=1
    )
    validation_sentences: int = setting(
        0, "validation sentences decoded for BLEU and chrF at each epoch's end (0: none)", low=0
    )
    validation_beam: int = setting(1, "beam size of that decode (1: greedy)", low=1)
    metric: str = setting(
        "loss",
        "the validation score that picks the best checkpoint and stops early",
        choices=("loss", "bleu", "chrf"),
    )
    min_improvement: float = setting(0.0, "a smaller gain in metric is no improvement", low=0.0)
    early_stopping_patience: int | None = setting(
        None, "validations without a better metric before the run stops", low=1
    )
    select: str = setting(
        "average",
        "what model.keras holds: the average of the last checkpoints, the best "
        "checkpoint by metric, or the moving average (ema)",
        choices=("average", "best", "ema"),
    )
    average_last: int = setting(1, "checkpoints averaged into model.keras", low=1)
    average_share: float = setting(0.0, "or this share of them, if more", low=0.0, high=1.0)
    heldout_split: str = setting(
        "test",
        "split the end-of-run greedy evaluation decodes (test: validation if there is none)",
        choices=("test", "validation", "none"),
    )


@dataclasses.dataclass
class DecodingConfig:
    """The search `kt export` uses by default (end-of-run greedy evaluation: `extra_length`)."""

    beam_size: int = setting(4, "beam size of the export's search (1: greedy)", low=1)
    alpha: float = setting(0.6, "length penalty exponent of the export's search", low=0.0)
    extra_length: int = setting(
        50, "target pieces a sentence may produce beyond its source pieces", low=1
    )
    tree_constraint: bool = setting(
        False, "parsers: the search writes only well-formed trees over the input's words"
    )
    penalty_form: str = setting(
        "gnmt", "length penalty: gnmt ((5 + |Y|) / 6) ** alpha, or power |Y| ** alpha",
        choices=tuple(PENALTY_FORMS),
    )  # fmt: skip
    max_output_length: int = setting(
        0, "the most target pieces of any sentence, the end included (0: none)", low=0
    )
    end_at_limit: bool = setting(False, "a sentence's last allowed piece is the end")


GROUPS = {
    "data": DataConfig,
    "batching": BatchingConfig,
    "model": ModelConfig,
    "optimization": OptimizationConfig,
    "budget": BudgetConfig,
    "output": OutputConfig,
    "decoding": DecodingConfig,
}


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run needs, by group: `config.batching.batch_tokens`."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    batching: BatchingConfig = dataclasses.field(default_factory=BatchingConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimization: OptimizationConfig = dataclasses.field(default_factory=OptimizationConfig)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    decoding: DecodingConfig = dataclasses.field(default_factory=DecodingConfig)

    def model_arguments(self, vocabulary_size, special_ids=None):
        """Arguments for `Transformer(**arguments)`: the preset's, then those set.

        Args:
            vocabulary_size: int, the tokenizer's size.
            special_ids: dict or None, `pad_id`, `bos_id`, `eos_id` of the
                tokenizer (`tokenizer.special_ids`), so that they agree.
        """
        model = self.model
        arguments = dict(PRESETS[model.preset]) if model.preset else {}
        for field in dataclasses.fields(model):
            value = getattr(model, field.name)
            if field.name not in ("preset", "init_from") and value is not None:
                arguments[field.name] = value
        return {"vocabulary_size": vocabulary_size, **arguments, **(special_ids or {})}

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared setting, as the flags, checks and docs see it."""

    group: str
    name: str
    type: object
    default: object
    help: str
    limits: dict


def settings():
    """Every declared setting, group by group, in declaration order."""
    found = []
    for group, cls in GROUPS.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            default = field.default_factory() if callable(field.default_factory) else field.default
            limits = {k: v for k, v in field.metadata.items() if k != "help" and v is not None}
            found.append(
                Setting(
                    group, field.name, hints[field.name], default, field.metadata["help"], limits
                )
            )
    return found


SETTINGS = {s.name: s for s in settings()}  # names are unique across groups (tested)


def coerce(name, value):
    """`value` (JSON, or a flag's string) as setting `name`'s declared type.

    Raises:
        ConfigError: naming the setting and the value, if it is of another type.
    """
    base, optional, item = base_type(SETTINGS[name].type)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("null", "none")):
        if optional:
            return None
        raise ConfigError(f"{name} may not be null. Received: {name}={value!r}")
    if base is list:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = value.split(",")
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list. Received: {name}={value!r}")
        return [parse_scalar(v, item, name, value) for v in value]
    return parse_scalar(value, base, name, value)


def check_limits(name, value):
    """Raises `ConfigError` unless `value` is within setting `name`'s declared limits."""
    limits = SETTINGS[name].limits
    values = value if isinstance(value, list) else [value]
    if "nargs" in limits and isinstance(value, list) and len(value) != limits["nargs"]:
        raise ConfigError(f"{name} takes {limits['nargs']} values. Received: {name}={value!r}")
    for v in values:
        if "choices" in limits and v not in limits["choices"]:
            raise ConfigError(
                f"{name} must be one of {list(limits['choices'])}. Received: {name}={value!r}"
            )
        bounds = [
            ("low", lambda v, b: v >= b, "at least"),
            ("high", lambda v, b: v <= b, "at most"),
            ("above", lambda v, b: v > b, "more than"),
            ("below", lambda v, b: v < b, "less than"),
        ]
        for key, holds, words in bounds:
            if key in limits and not holds(v, limits[key]):
                raise ConfigError(
                    f"{name} must be {words} {limits[key]}. Received: {name}={value!r}"
                )


def _check_corpus(data):
    """The rules between the corpus settings (`DataConfig`)."""
    if data.corpus == "multi30k" and not data.multi30k_dir:
        raise ConfigError("corpus 'multi30k' needs multi30k_dir (--multi30k-dir)")
    if data.corpus == "files" and not data.train_files:
        raise ConfigError("corpus 'files' needs train_files (--train-files SOURCE TARGET)")
    if data.train_files and len(data.train_files) % 2:
        raise ConfigError(
            "train_files takes SOURCE TARGET pairs, an even number of files. "
            f"Received: train_files={data.train_files!r}"
        )
    if data.train_weights and len(data.train_weights) * 2 != len(data.train_files or []):
        raise ConfigError(
            "train_weights takes one weight per train_files pair "
            f"({len(data.train_files or []) // 2}). Received: train_weights={data.train_weights!r}"
        )
    if data.corpus == "tfds" and not data.tfds_name:
        raise ConfigError("corpus 'tfds' needs tfds_name (--tfds-name NAME)")
    if data.corpus == "ptb" and not data.treebank_dir:
        raise ConfigError("corpus 'ptb' needs treebank_dir (--treebank-dir)")


def validate(config):
    """Checks every setting's range and the rules between settings.

    Returns:
        `config`.

    Raises:
        ConfigError: naming the first bad setting and its value.
    """
    for item in SETTINGS.values():
        value = getattr(getattr(config, item.group), item.name)
        if value is not None:
            check_limits(item.name, value)
    _check_corpus(config.data)
    model, optimization = config.model, config.optimization
    if config.decoding.tree_constraint and not config.batching.whole_target_tokens:
        raise ConfigError(
            "tree_constraint needs whole_target_tokens: the constraint reads the brackets and "
            "tags from the vocabulary's whole pieces"
        )
    batching = config.batching
    if batching.whole_source_words > batching.vocabulary_size * 3 // 4:
        raise ConfigError(
            "whole_source_words must be at most three quarters of vocabulary_size "
            f"({batching.vocabulary_size}). Received: whole_source_words="
            f"{batching.whole_source_words}"
        )
    arguments = config.model_arguments(config.batching.vocabulary_size)
    missing = [name for name in MODEL_SIZES if name not in arguments]
    if missing:
        raise ConfigError(f"With no preset, the model needs {missing} (--set model.NAME=VALUE)")
    if arguments["hidden_dim"] % arguments["num_heads"]:
        raise ConfigError(
            f"num_heads must divide hidden_dim ({arguments['hidden_dim']}). "
            f"Received: num_heads={arguments['num_heads']}"
        )
    if model.activation is not None:
        try:
            keras.activations.get(model.activation)
        except ValueError:
            raise ConfigError(
                f"activation must be a Keras activation. Received: activation={model.activation!r}"
            ) from None
    if model.learned_positions and not model.max_positions:
        raise ConfigError("learned_positions needs max_positions (--max-positions)")
    if optimization.steps is None and not config.budget.max_minutes:
        raise ConfigError("steps may be left out (null) only with max_minutes")
    budget = config.budget
    if budget.max_minutes is not None and budget.max_minutes <= budget.reserve_minutes:
        raise ConfigError(
            f"max_minutes must be more than reserve_minutes ({budget.reserve_minutes}). "
            f"Received: max_minutes={budget.max_minutes}"
        )
    output = config.output
    if output.metric != "loss" and not output.validation_sentences:
        raise ConfigError(
            f"metric {output.metric} needs validation_sentences (--validation-sentences 500)"
        )
    no_validation = config.data.corpus == "files" and not config.data.validation_files
    if no_validation and (output.select == "best" or output.early_stopping_patience):
        raise ConfigError(
            "select best and early_stopping_patience compare validations: corpus files needs "
            "validation_files (--validation-files DEV.SOURCE DEV.TARGET)"
        )
    if output.select == "ema" and not optimization.ema:
        raise ConfigError("select ema needs optimization.ema (--ema 0.9999)")
    if output.keep_checkpoints and output.average_share:
        raise ConfigError(
            "average_share counts every checkpoint, which keep_checkpoints removes: "
            "set average_last instead"
        )
    service = config.batching.data_service
    if service is not None and not re.fullmatch(r"(grpc://)?[^\s:/]+:\d+", service):
        raise ConfigError(
            f"data_service must be grpc://HOST:PORT. Received: data_service={service!r}"
        )
    if batching.extend_vocabulary and not model.init_from:
        raise ConfigError("extend_vocabulary grows a source's vocabulary: it needs init_from")
    if config.batching.batch_tokens < config.batching.max_length:
        raise ConfigError(
            f"batch_tokens must be at least max_length ({config.batching.max_length}). "
            f"Received: batch_tokens={config.batching.batch_tokens}"
        )
    return config
