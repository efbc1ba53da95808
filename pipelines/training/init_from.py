"""Starting a run from a trained model (`--init-from`): its architecture, vocabulary, weights.

The new run is a run of its own (its schedule, data and output folder), but
its model is the source's: the architecture settings are read from the
source's `.keras` file, its SentencePiece file is copied byte for byte (no
vocabulary is trained; with `extend_vocabulary` it is grown, and so is the
embedding: `load_source_weights`), and the built model takes the source's
weights before the first step. A resumed fine-tuning run continues from its own
backup, which `RunBackup` restores over those weights.
"""

import dataclasses
import json
import logging
import os
import shutil
import zipfile

import numpy as np
import sentencepiece

from keras_transformer.models.presets import PRESETS
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.data.vocabulary_extension import model_type, spellings
from pipelines.errors import ConfigError
from pipelines.files import atomic_output
from pipelines.parsing.corpus import tags_path
from pipelines.training.config import SETTINGS, DecodingConfig
from pipelines.training.loading import flatten
from pipelines.training.recorded import run_settings

logger = logging.getLogger(__name__)

# Model settings that shape the weights: the source's, and a new value is refused.
ARCHITECTURE = (
    "num_layers",
    "hidden_dim",
    "intermediate_dim",
    "num_heads",
    "activation",
    "layer_norm_epsilon",
    "normalize_first",
    "share_source_target_embeddings",
    "tie_output_embeddings",
    "learned_positions",
    "max_positions",
    "sinusoid_layout",
    "output_bias",
)
# Model settings a fine-tuning run may set; the source's where it does not.
REGULARIZATION = ("dropout", "attention_dropout", "activation_dropout")
# Settings of the source run's config.json a run started from it keeps, unless given: the
# shape of its data (lengths, batches, subword sampling, whole tokens) and its search.
KEPT = (
    "max_length",
    "batch_tokens",
    "subword_sampling",
    "subword_copies",
    "shuffle_buffer",
    "whole_target_tokens",
    "whole_source_words",
    *(field.name for field in dataclasses.fields(DecodingConfig)),
)


@dataclasses.dataclass(frozen=True)
class Source:
    """The files a run starts from: a `.keras` model and the vocabulary beside it."""

    model: str
    vocabulary: str

    @property
    def tags(self):
        """A parser vocabulary's tag list (`tags_path`), or None where the source has none."""
        path = tags_path(self.vocabulary)
        return path if os.path.isfile(path) else None


def find_source(path):
    """The model and vocabulary of `path`: a run folder, or a `.keras` file.

    A `.keras` file's vocabulary is the `sentencepiece.model` beside it, or
    in the folder above for a run's `checkpoints/epoch-NNN.keras`.

    Args:
        path: str, a run folder (its `model.keras`) or a `.keras` file.

    Returns:
        a `Source`.

    Raises:
        ConfigError: naming the file that is missing.
    """
    if os.path.isdir(path):
        model = os.path.join(path, "model.keras")
        if not os.path.isfile(model):
            raise ConfigError(
                f"init_from: {path} holds no model.keras (a finished run has one; give one of "
                "its checkpoints/epoch-NNN.keras instead)"
            )
    elif os.path.isfile(path) and path.endswith(".keras"):
        model = path
    else:
        raise ConfigError(f"init_from: {path} is neither a run folder nor a .keras file")
    folder = os.path.dirname(os.path.abspath(model))
    for where in (folder, os.path.dirname(folder)):
        vocabulary = os.path.join(where, "sentencepiece.model")
        if os.path.isfile(vocabulary):
            return Source(model, vocabulary)
    raise ConfigError(f"init_from: no sentencepiece.model beside {model} or in the folder above")


def source_arguments(model_path):
    """The `Transformer` constructor arguments stored in a `.keras` file, weights unread.

    Raises:
        ConfigError: the file is not a `.keras` archive of a keras_transformer `Transformer`.
    """
    try:
        with zipfile.ZipFile(model_path) as archive:
            stored = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"init_from: {model_path} is not a .keras model file") from None
    if stored.get("registered_name") != "keras_transformer>Transformer":
        found = stored.get("registered_name") or stored.get("class_name")
        raise ConfigError(
            f"init_from: {model_path} holds a {found}, not a keras_transformer Transformer"
        )
    import keras_transformer as kt

    # Through the model's own `from_config`: files of earlier versions hold older names.
    arguments = kt.Transformer.from_config(stored["config"]).get_config()
    activation = arguments.get("activation")
    if isinstance(activation, dict):  # a serialized object, not a built-in's name
        arguments["activation"] = activation.get("config", activation)
    return arguments


def source_model_arguments(source, arguments):
    """The source model's constructor arguments, with the run's dropouts.

    Args:
        source: a `Source`.
        arguments: dict, the run's `TrainConfig.model_arguments` (its dropouts are kept).

    Returns:
        dict for `Transformer(**arguments)`: every option the source was built
        with (an imported model's too), none of the base layer's (name, dtype).
    """
    stored = source_arguments(source.model)
    built = {k: v for k, v in stored.items() if k not in ("name", "trainable", "dtype")}
    return {**built, **{name: arguments[name] for name in REGULARIZATION if name in arguments}}


def _check_vocabulary(source, size):
    try:
        pieces = sentencepiece.SentencePieceProcessor(model_file=source.vocabulary).get_piece_size()
    except (RuntimeError, OSError) as error:
        raise ConfigError(
            f"init_from: {source.vocabulary} is not a SentencePiece model ({error})"
        ) from None
    if pieces != size:
        raise ConfigError(
            f"init_from: {source.vocabulary} has {pieces} pieces, but {source.model} was "
            f"built for {size}: they are not one model's files"
        )


def given_settings(config_file, settings):
    """The names of the settings a run was given, not left to its recipe.

    Args:
        config_file: str or None, the `--config` file (one that cannot be read
            adds nothing: `load_config` refuses it).
        settings: dict, the flags and `--set` items.

    Returns:
        set of setting names.
    """
    given = set(flatten(settings or {}, "--set"))
    if config_file:
        try:
            with open(config_file, encoding="utf-8") as handle:
                given |= set(flatten(json.load(handle), config_file))
        except (OSError, ValueError):  # `load_config` names what is wrong with the file
            pass
    return given


def apply_source(config, given):
    """Sets the source model's architecture on `config`, refusing a contradicting setting.

    The architecture settings and the vocabulary size become the source's;
    dropouts too, unless given, and the `KEPT` settings its run folder's
    config.json records (none for a `.keras` file outside a run folder).
    `preset` is cleared (the architecture is spelled out).

    Args:
        config: a `TrainConfig` with `model.init_from` set.
        given: set of setting names given to the run (`given_settings`).

    Returns:
        the `Source`.

    Raises:
        ConfigError: one line naming each given setting that differs from the
            source, with both values.
    """
    source = find_source(config.model.init_from)
    if os.path.dirname(os.path.abspath(source.vocabulary)) == os.path.abspath(
        config.output.output_dir
    ):
        raise ConfigError(
            f"init_from: {config.model.init_from} is this run's own output_dir; "
            "a run started from it trains into a new --output-dir"
        )
    arguments = source_arguments(source.model)
    _check_vocabulary(source, arguments["vocabulary_size"])
    # Recorded in the run's config, so its data is checked against it rather than inferred.
    config.batching.target_vocabulary = target_vocabulary_path(source.vocabulary) != (
        source.vocabulary
    )
    if config.batching.extend_vocabulary:
        _check_extendable(config, source)
    asked = {}
    if "preset" in given and config.model.preset:
        asked.update(PRESETS[config.model.preset])
    asked.update({name: getattr(config.model, name) for name in ARCHITECTURE if name in given})
    if "vocabulary_size" in given:
        asked["vocabulary_size"] = config.batching.vocabulary_size
    contradictions = [
        f"{SETTINGS[name].group}.{name}={json.dumps(value)} where it has "
        f"{json.dumps(arguments[name])}"
        for name, value in asked.items()
        if name in arguments and value != arguments[name] and name not in REGULARIZATION
    ]
    if contradictions:
        raise ConfigError(
            f"init_from: the architecture comes from {source.model}, and these settings "
            f"contradict it: {'; '.join(contradictions)}. Leave them out, or train a new "
            "model without --init-from"
        )
    config.model.preset = None
    for name in ARCHITECTURE + REGULARIZATION:
        if name not in given or name in ARCHITECTURE:
            setattr(config.model, name, arguments[name])
    config.batching.vocabulary_size = arguments["vocabulary_size"]
    kept = run_settings(os.path.dirname(os.path.abspath(source.vocabulary)), KEPT)
    for name, value in kept.items():
        if name not in given:
            setattr(getattr(config, SETTINGS[name].group), name, value)
    taken = [f"{name} {json.dumps(value)}" for name, value in kept.items() if name not in given]
    if taken:
        logger.info("init_from: the source run's %s", ", ".join(taken))
    return source


def _check_extendable(config, source):
    """Refuses `extend_vocabulary` for a source whose vocabulary cannot grow, before any work."""
    from pipelines.training.heldout import is_parser

    kind = None
    if config.batching.target_vocabulary:
        kind = "comes with a vocabulary a side"
    elif source.tags or is_parser(config) or config.batching.whole_target_tokens:
        kind = "is a parser's (whole target tokens)"
    elif (found := model_type(source.vocabulary)) != "bpe":
        kind = f"is a {found} model"
    if kind:
        raise ConfigError(
            f"extend_vocabulary: {source.vocabulary} {kind}; only a joint BPE translation "
            "vocabulary grows"
        )


def copy_vocabulary(source, out_dir):
    """Copies the source's vocabulary files into `out_dir`, byte for byte.

    The `sentencepiece.model`, and a target side's or a parser's tag list beside it.

    Returns:
        str, the copied `sentencepiece.model`.
    """
    copied = os.path.join(out_dir, "sentencepiece.model")
    files = [(source.vocabulary, copied)]  # last: its file marks the step done for a resume
    if source.tags:
        files.insert(0, (source.tags, tags_path(copied)))
    target = target_vocabulary_path(source.vocabulary)
    if target != source.vocabulary:  # one a side (an imported model)
        files.insert(0, (target, os.path.join(out_dir, os.path.basename(target))))
    for original, copy in files:
        with atomic_output(copy) as staging:
            shutil.copyfile(original, staging)
    return copied


def load_source_weights(model, source, spm_path):
    """Gives a built model the source's weights, with new rows where the vocabulary grew.

    A vocabulary grown by `extend_vocabulary` keeps the source's pieces first:
    their rows (embedding, untied output projection, output bias) are the
    source's, bit for bit; each new piece's row is the mean of the source's
    rows for the pieces the source wrote it with (`spellings`).

    Args:
        model: a built `Transformer` on the vocabulary at `spm_path`.
        source: a `Source`.
        spm_path: str, the run's SentencePiece model: the source's, or the
            source's with pieces appended.
    """
    old_size = source_arguments(source.model)["vocabulary_size"]
    pieces = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    if pieces.get_piece_size() == old_size:
        model.load_weights(source.model)
        return
    import keras

    original = keras.saving.load_model(source.model, compile=False)
    added = [pieces.id_to_piece(i) for i in range(old_size, pieces.get_piece_size())]
    rows = spellings(source.vocabulary, added)
    if len(model.weights) != len(original.weights):
        raise ConfigError(f"init_from: {source.model} does not match the run's model")
    for weight, value in zip(model.weights, original.weights, strict=True):
        value = keras.ops.convert_to_numpy(value)
        grown = [
            i for i, (a, b) in enumerate(zip(weight.shape, value.shape, strict=True)) if a != b
        ]
        if grown:  # the vocabulary's axis
            axis = grown[0]
            means = [np.take(value, ids, axis=axis).mean(axis=axis) for ids in rows]
            value = np.concatenate([value, np.stack(means, axis=axis)], axis=axis)
        weight.assign(value)
