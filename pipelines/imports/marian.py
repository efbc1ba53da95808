"""Marian (OPUS-MT) translation models in the Hugging Face layout, imported into a run folder.

The Helsinki-NLP OPUS-MT models are Transformers of the paper's base shape,
trained with Marian and published in the Hugging Face layout: `config.json`,
`model.safetensors` or `pytorch_model.bin`, `source.spm`, `target.spm`,
`vocab.json` (and `target_vocab.json` with `separate_vocabs`). What they do
differently from the paper's model, and the option of ours that carries it:

- positions: the paper's sinusoid, its sines in the first half of the
  dimensions and its cosines in the second: `sinusoid_layout="concatenated"`;
- a bias on the output logits (`final_logits_bias`): `output_bias=True`;
- swish (`activation="silu"`) and torch's LayerNorm epsilon, 1e-5;
- decoding starts with the padding token, whose embedding row is zero:
  `bos_id = pad_id` (the decoder attends to its first input whatever its id);
- two SentencePiece models, one a side, and a vocabulary mapping their pieces
  to the model's ids. They become two SentencePiece files of ours whose ids
  are the vocabulary's (`sentencepiece.model` for the source and
  `sentencepiece.target.model`, see `merged_vocabulary`), so every command and
  the SavedModel take and return text as for a model trained here;
- sources end with `</s>` and have no start token, as ours do.

Read in `transformers`' `modeling_marian.py` and `tokenization_marian.py`;
the tests compare the imported model with `MarianMTModel` and
`MarianTokenizer`. Nothing of `transformers` is needed to import.
"""

import json
import logging
import os
import re
import shutil

from pipelines.errors import ConfigError, DataError
from pipelines.files import read_json, staging_folder, write_json
from pipelines.imports.marian_weights import load_weights, read_weights
from pipelines.imports.vocabulary import merged_vocabulary

logger = logging.getLogger(__name__)

# The files a Hub download fetches (the weights in one of two formats).
HUB_PATTERNS = ["*.json", "*.spm"]
# `MarianConfig`'s defaults, for a config.json that leaves a field out.
MARIAN_DEFAULTS = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "scale_embedding": False,
    "max_position_embeddings": 1024,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "decoder_start_token_id": 58100,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
# Marian's activations as Keras names (transformers' "gelu" is the exact one, as Keras's).
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
# Options of older configs that some Marian conversions set; only these values map.
FIXED = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
}


# `GenerationConfig`'s defaults for what a Marian model's generation settings may set.
GENERATION_DEFAULTS = {
    "num_beams": 1,
    "length_penalty": 1.0,
    "max_length": 20,
    "max_new_tokens": None,
    "forced_eos_token_id": None,
    "bad_words_ids": None,
    "early_stopping": False,
    "renormalize_logits": False,
    "do_sample": False,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "min_length": 0,
}
# Generation settings an export does not take: an import reports those set.
UNCARRIED = (
    "early_stopping", "renormalize_logits", "do_sample", "no_repeat_ngram_size",
    "repetition_penalty", "min_length",
)  # fmt: skip


def locate(source, cache_dir=None):
    """A local folder for `source`: the folder itself, or a Hub model downloaded to the cache.

    Args:
        source: str, a folder in the Hugging Face layout, or a Hub name
            such as "Helsinki-NLP/opus-mt-en-de".
        cache_dir: str or None, `huggingface_hub`'s cache (None: its default).

    Raises:
        ConfigError: `source` is neither.
        DataError: the download failed (the Hub's message included).
    """
    if os.path.isdir(source):
        return source
    if os.path.exists(source) or not re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        raise ConfigError(
            f"{source}: neither a model folder nor a Hugging Face Hub name (OWNER/NAME)"
        )
    import huggingface_hub

    try:
        folder = huggingface_hub.snapshot_download(
            source, allow_patterns=[*HUB_PATTERNS, "model.safetensors"], cache_dir=cache_dir
        )
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            huggingface_hub.hf_hub_download(source, "pytorch_model.bin", cache_dir=cache_dir)
    except (OSError, ValueError, huggingface_hub.errors.HfHubHTTPError) as error:
        raise DataError(
            f"{source}: could not download it from the Hugging Face Hub ({error})"
        ) from None
    return folder


def read_object(path):
    """The JSON object in the file `path`.

    Raises:
        DataError: naming the file, where it cannot be read or holds no JSON object.
    """
    try:
        value = read_json(path)
    except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError included
        raise DataError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: holds a JSON {type(value).__name__}, not an object")
    return value


def read_config(folder):
    """`config.json` of a Marian model folder, `MarianConfig`'s defaults filled in.

    Raises:
        DataError: the folder is not a Marian model's, or a size or id in its
            config.json is not a whole number (naming the field and value).
    """
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise DataError(f"{folder}: no config.json, not a model folder in the Hugging Face layout")
    config = read_object(path)
    if config.get("model_type") != "marian":
        raise DataError(
            f"{path}: model_type {config.get('model_type')!r}, not a Marian model ('marian')"
        )
    config = {**MARIAN_DEFAULTS, **config}
    for name, default in MARIAN_DEFAULTS.items():
        value, least = config[name], 0 if name.endswith("_id") else 1  # an id may be 0
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= least
        if isinstance(default, int) and not isinstance(default, bool) and not whole:
            raise DataError(f"{path}: {name} is {json.dumps(value)}, not a whole number >= {least}")
    return config


def read_generation(folder):
    """The generation settings `generate` uses: generation_config.json, else config.json's.

    Returns:
        dict of `GENERATION_DEFAULTS`' names, the defaults filled in.

    Raises:
        DataError: naming the file, where a size is not a whole number.
    """
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):  # `generate` reads them from config.json then
        path = os.path.join(folder, "config.json")
    values = read_object(path)
    generation = {name: values.get(name, default) for name, default in GENERATION_DEFAULTS.items()}
    for name, least in (("num_beams", 1), ("max_length", 2), ("max_new_tokens", 1)):
        value = generation[name]
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= least
        if not whole and not (name == "max_new_tokens" and value is None):
            raise DataError(f"{path}: {name} is {json.dumps(value)}, not a whole number >= {least}")
    if not isinstance(generation["length_penalty"], (int, float)):
        raise DataError(f"{path}: length_penalty is {json.dumps(generation['length_penalty'])}")
    forced = generation["forced_eos_token_id"]
    if isinstance(forced, list):  # `generate` takes several; one end token is all there is here
        generation["forced_eos_token_id"] = forced[0] if len(forced) == 1 else forced
    return generation


def decoding_settings(generation, config):
    """The run's `decoding` settings for a Marian model's generation settings.

    The search `generate` runs: beam size `num_beams`, the penalty
    `length ** length_penalty`, at most `max_length - 1` target tokens (its
    `max_length` counts the start token) or `max_new_tokens`, and with
    `forced_eos_token_id` the last of them the end. Banning the padding
    token (`bad_words_ids`, as OPUS-MT models do) is what every search here
    does. What has no equivalent is returned by name, to be reported.

    Args:
        generation: dict, `read_generation`'s.
        config: dict, `read_config`'s.

    Returns:
        `(settings, not_carried)`: dict of `decoding.*` settings, and a list
        of "name=value" strings.
    """
    not_carried = []
    alpha = generation["length_penalty"]
    if alpha < 0:
        not_carried.append(f"length_penalty={json.dumps(alpha)} (a penalty >= 0 only)")
        alpha = 0.0
    limit = generation["max_new_tokens"] or max(1, generation["max_length"] - 1)
    settings = {
        "decoding.beam_size": max(1, generation["num_beams"]),
        "decoding.alpha": float(alpha),
        "decoding.penalty_form": "power",
        "decoding.max_output_length": limit,
        "decoding.end_at_limit": generation["forced_eos_token_id"] == config["eos_token_id"],
    }
    forced = generation["forced_eos_token_id"]
    if forced is not None and forced != config["eos_token_id"]:
        not_carried.append(f"forced_eos_token_id={json.dumps(forced)} (only the end token)")
    banned = [[config["pad_token_id"]], [config["decoder_start_token_id"]]]
    others = [ids for ids in generation["bad_words_ids"] or [] if ids not in banned]
    if others:
        not_carried.append(f"bad_words_ids={json.dumps(others)} (only the padding token)")
    for name in UNCARRIED:
        if generation[name] != GENERATION_DEFAULTS[name]:
            not_carried.append(f"{name}={json.dumps(generation[name])}")
    return settings, not_carried


def model_arguments(config, vocabulary_sizes):
    """`Transformer` arguments for a Marian config; refuses what the model cannot represent.

    Args:
        config: dict, `read_config`'s.
        vocabulary_sizes: `(source, target)` int sizes.

    Raises:
        ConfigError: one line naming each setting that cannot be mapped, with its value.
    """
    differences = []
    for encoder, decoder in (
        ("encoder_layers", "decoder_layers"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_attention_heads", "decoder_attention_heads"),
    ):
        if config[encoder] != config[decoder]:
            differences.append(
                f"{encoder}={config[encoder]} and {decoder}={config[decoder]} differ "
                "(one value serves both stacks)"
            )
    if not config["scale_embedding"]:
        differences.append("scale_embedding=false (embeddings are scaled by sqrt(d_model))")
    for name, value in FIXED.items():
        if name in config and config[name] != value:
            differences.append(f"{name}={json.dumps(config[name])} (only {json.dumps(value)})")
    activation = config["activation_function"]
    if activation not in ACTIVATIONS:
        differences.append(f"activation_function={activation!r} (one of {sorted(ACTIVATIONS)})")
    if config["d_model"] % config["encoder_attention_heads"]:
        differences.append("d_model is not a multiple of the attention heads")
    if config["decoder_start_token_id"] != config["pad_token_id"]:
        differences.append(
            f"decoder_start_token_id={config['decoder_start_token_id']} is not the padding "
            f"token {config['pad_token_id']} (whose embedding row is zero)"
        )
    if differences:
        raise ConfigError(f"the Marian model cannot be imported: {'; '.join(differences)}")
    shared = config["share_encoder_decoder_embeddings"]
    return {
        "vocabulary_size": vocabulary_sizes[0],
        "target_vocabulary_size": vocabulary_sizes[1],
        "num_layers": config["encoder_layers"],
        "hidden_dim": config["d_model"],
        "intermediate_dim": config["encoder_ffn_dim"],
        "num_heads": config["encoder_attention_heads"],
        "dropout": config["dropout"],
        "attention_dropout": config["attention_dropout"],
        "activation_dropout": config["activation_dropout"],
        "activation": ACTIVATIONS[activation],
        "layer_norm_epsilon": 1e-5,  # torch's nn.LayerNorm default
        "normalize_first": False,
        "share_source_target_embeddings": shared,
        "tie_output_embeddings": config["tie_word_embeddings"],
        "pad_id": config["pad_token_id"],
        "bos_id": config["decoder_start_token_id"],
        "eos_id": config["eos_token_id"],
        "sinusoid_layout": "concatenated",
        "output_bias": True,
    }


def read_vocabularies(folder, config):
    """The source and target `{piece: id}` vocabularies and their sizes.

    Returns:
        `(source_vocabulary, target_vocabulary, (source_size, target_size))`.

    Raises:
        DataError: a file is missing, or an id does not fit the model.
    """
    path = os.path.join(folder, "tokenizer_config.json")
    separate = os.path.isfile(path) and read_object(path).get("separate_vocabs", False)
    names = ("vocab.json", "target_vocab.json" if separate else "vocab.json")
    vocabularies = []
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise DataError(f"{folder}: no {name}, not a Marian model folder")
        vocabulary = read_object(path)
        wrong = [
            (piece, index)
            for piece, index in vocabulary.items()
            if not isinstance(index, int) or isinstance(index, bool) or index < 0
        ]
        if not vocabulary:
            raise DataError(f"{path}: an empty vocabulary")
        if wrong:
            raise DataError(f"{path}: not a vocabulary of pieces to ids (such as {wrong[:2]})")
        vocabularies.append(vocabulary)
    shared = config["share_encoder_decoder_embeddings"]
    # `MarianConfig` reads a missing decoder_vocab_size as vocab_size.
    target_size = config["vocab_size"] if shared else config["decoder_vocab_size"]
    sizes = (config["vocab_size"], target_size or config["vocab_size"])
    for name, vocabulary, size in zip(names, vocabularies, sizes, strict=True):
        if max(vocabulary.values()) >= size:
            raise DataError(
                f"{os.path.join(folder, name)}: ids up to {max(vocabulary.values())}, "
                f"beyond the model's vocabulary of {size}"
            )
    return vocabularies[0], vocabularies[1], sizes


def run_config(arguments, config, output_dir, decoding):
    """The imported run's `config.json`: its architecture, limits and search, as a trained run's."""
    from pipelines.training.loading import load_config

    model = {
        name: arguments[name]
        for name in (
            "num_layers", "hidden_dim", "intermediate_dim", "num_heads", "dropout",
            "attention_dropout", "activation_dropout", "activation", "layer_norm_epsilon",
            "normalize_first", "share_source_target_embeddings", "tie_output_embeddings",
            "sinusoid_layout", "output_bias",
        )
    }  # fmt: skip
    settings = {f"model.{name}": value for name, value in model.items()}
    settings.update(
        {
            "model.preset": None,
            "vocabulary_size": arguments["vocabulary_size"],
            "max_length": config["max_position_embeddings"],
            # What a fine-tuning run keeps (`--init-from`): batches of a model this size, not
            # the embedded corpus's `default` recipe's 1,024 tokens.
            "batch_tokens": max(4096, config["max_position_embeddings"]),
            "target_vocabulary": True,  # sentencepiece.target.model, even where shared
            "output_dir": output_dir,
            **decoding,
        }
    )
    return load_config("default", settings=settings).to_dict()


def import_marian(source, output_dir, force=False, cache_dir=None):
    """Imports a Marian model (a folder or a Hub name) as a run folder.

    The folder holds `model.keras`, `sentencepiece.model` (the source side),
    `sentencepiece.target.model`, `config.json` (with the model's generation
    settings as its `decoding` group, `decoding_settings`) and `import.json`
    (where it came from, its original config, the generation settings not
    carried), and `kt export`, `kt translate`,
    `kt score`, `kt ct2-export`, `kt attention` and `kt train --init-from`
    take it as they take a trained run.

    Args:
        source: str, a folder in the Hugging Face layout or a Hub name.
        output_dir: str, the run folder to write (written whole, then renamed).
        force: bool, replace an existing `output_dir`.
        cache_dir: str or None, the Hub cache for a download.

    Returns:
        dict: the paths written and the model's sizes.

    Raises:
        ConfigError, DataError: naming the file or setting at fault, before
            anything is written.
    """
    if os.path.exists(output_dir) and os.listdir(output_dir) and not force:
        raise ConfigError(f"{output_dir} exists and is not empty; pass --force to replace it")
    folder = locate(source, cache_dir)
    config = read_config(folder)
    source_vocabulary, target_vocabulary, sizes = read_vocabularies(folder, config)
    arguments = model_arguments(config, sizes)
    specials = {
        "unk_id": source_vocabulary.get("<unk>"),
        "eos_id": config["eos_token_id"],
        "pad_id": config["pad_token_id"],
    }
    arguments["unk_id"] = specials["unk_id"]
    for name, vocabulary in (("vocab.json", source_vocabulary), ("target", target_vocabulary)):
        expected = {"<unk>": specials["unk_id"], "</s>": specials["eos_id"]}
        expected["<pad>"] = specials["pad_id"]
        found = {piece: vocabulary.get(piece) for piece in expected}
        if found != expected:
            raise DataError(
                f"{folder}: the {name} vocabulary's special pieces {found} are not the "
                f"config's {expected}"
            )
    for spm in ("source.spm", "target.spm"):
        if not os.path.isfile(os.path.join(folder, spm)):
            raise DataError(f"{folder}: no {spm}, not a Marian model folder")
    vocabularies = [
        merged_vocabulary(os.path.join(folder, spm), vocabulary, size, specials)
        for spm, vocabulary, size in zip(
            ("source.spm", "target.spm"), (source_vocabulary, target_vocabulary), sizes, strict=True
        )
    ]
    tensors = read_weights(folder)
    decoding, not_carried = decoding_settings(read_generation(folder), config)
    if not_carried:
        logger.warning(
            "generation settings the export does not carry (it searches without them): %s",
            ", ".join(not_carried),
        )
    imported = {"config": config, "decoding": decoding, "not_carried": not_carried}
    return _write_run(folder, source, output_dir, imported, arguments, tensors, vocabularies)


def _write_run(folder, source, output_dir, imported, arguments, tensors, vocabularies):
    import keras_transformer as kt

    model = kt.Transformer(**arguments)
    model.build(((None, None), (None, None)))
    load_weights(model, tensors, folder)
    parent = os.path.dirname(os.path.abspath(output_dir))
    staging = staging_folder(parent)
    try:
        model.save(os.path.join(staging, "model.keras"))
        for name, data in zip(
            ("sentencepiece.model", "sentencepiece.target.model"), vocabularies, strict=True
        ):
            with open(os.path.join(staging, name), "wb") as handle:
                handle.write(data)
        settings = run_config(arguments, imported["config"], output_dir, imported["decoding"])
        write_json(os.path.join(staging, "config.json"), settings)
        original = read_json(os.path.join(folder, "config.json"))
        record = {"format": "marian", "source": source, "config": original}
        record["generation_not_carried"] = imported["not_carried"]
        write_json(os.path.join(staging, "import.json"), record)
        if os.path.exists(output_dir):
            shutil.rmtree(output_dir)
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "model": os.path.join(output_dir, "model.keras"),
        "parameters": model.count_params(),
        "vocabulary_sizes": [arguments["vocabulary_size"], arguments["target_vocabulary_size"]],
    }
