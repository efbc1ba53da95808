"""A joint SentencePiece vocabulary, trained with sentencepiece and applied in-graph.

The paper shares one byte-pair vocabulary between source and target (section
5.1). It is trained here with the sentencepiece library and applied inside
tf.data and inside the exported SavedModel with tensorflow-text's
`SentencepieceTokenizer`, from the same model file.
"""

import collections
import os
from typing import NamedTuple

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.tokenizers import SPECIAL_IDS, sentencepiece_model_bytes
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import DataError
from pipelines.files import atomic_output

# The ids the Transformer model expects by default (pad_id, bos_id, eos_id).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = (
    SPECIAL_IDS[name] for name in ("pad_id", "unk_id", "bos_id", "eos_id")
)
# SentencePiece's mark of a word's start (U+2581).
WORD_MARK = "\u2581"


def train_sentencepiece(
    sentences,
    model_path,
    vocabulary_size=8000,
    model_type="bpe",
    character_coverage=1.0,
    split_digits=True,
    max_sentences=2_000_000,
    seed=0,
    whole_tokens=(),
    options=None,
):
    """Trains a SentencePiece model on an iterable of sentences: a run's vocabulary file.

    A script of one's own wants `keras_transformer.tokenizers.train_sentencepiece`,
    which returns a tokenizer (the same ids, no TensorFlow).

    Args:
        sentences: iterable of str, source and target sentences together for a
            joint vocabulary; read as a stream.
        model_path: str, where to write the `.model` file.
        vocabulary_size: int, pieces including the four special ids.
        model_type: "bpe" (the paper's choice) or "unigram".
        character_coverage: float, share of characters the vocabulary covers.
        split_digits: bool, every digit is a piece of its own.
        max_sentences: int, sentences sampled for training at most.
        seed: int, sampling seed.
        whole_tokens: iterable of str, tokens kept as one piece each where
            they stand as a word (a closed target vocabulary such as a
            linearised tree's `(NP`, `)NP`, `XX`; `frequent_words`).
        options: dict or None, other SentencePiece trainer options
            (`{"byte_fallback": True}`); the special ids are the model's.

    Returns:
        str, `model_path`.
    """
    count = 0

    def counted():  # a stream: SentencePiece keeps its own copy, no list is made here
        nonlocal count
        for sentence in sentences:
            count += bool(sentence)
            yield sentence

    spm.set_random_generator_seed(seed)
    try:
        data = sentencepiece_model_bytes(
            counted(), vocabulary_size, model_type=model_type,
            character_coverage=character_coverage, split_digits=split_digits,
            input_sentence_size=max_sentences, shuffle_input_sentence=True,
            # With the word-boundary mark: `▁(NP` is one piece where `(NP`
            # alone would leave a `▁` piece before every token.
            user_defined_symbols=[WORD_MARK + token for token in sorted(set(whole_tokens))],
            **(options or {}),
        )  # fmt: skip
    except ValueError as error:
        if not count:
            raise DataError("Cannot train a SentencePiece vocabulary on an empty corpus") from None
        raise DataError(str(error)) from None
    os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
    with atomic_output(model_path) as staging:  # its presence marks the step done for a rerun
        with open(staging, "wb") as handle:
            handle.write(data)
    return model_path


def frequent_words(sentences, count):
    """The `count` most frequent space-separated words of `sentences`.

    Kept whole by `train_sentencepiece(whole_tokens=...)`, they make a
    word-level vocabulary of the most frequent words, with subword pieces
    for the rest.

    Args:
        sentences: iterable of str.
        count: int, words wanted (0: none).

    Returns:
        list of str, most frequent first, ties in order of first appearance.
    """
    if count <= 0:
        return []
    counts = collections.Counter(word for sentence in sentences for word in sentence.split())
    return [word for word, _ in counts.most_common(count)]


def load_tokenizer(model_path):
    """Loads a SentencePiece model file as a tensorflow-text tokenizer.

    Args:
        model_path: str, a `.model` file written by `train_sentencepiece`.

    Returns:
        `tensorflow_text.SentencepieceTokenizer` producing int32 ids without
        BOS or EOS (the pipeline adds those).
    """
    if not os.path.exists(model_path):
        raise DataError(f"SentencePiece model not found: {model_path}")
    with open(model_path, "rb") as handle:
        model = handle.read()
    return tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)


class Sides(NamedTuple):
    """The two tokenizers of a model with one SentencePiece model a side (an imported Marian's).

    Wherever a function of `pipelines.serving.translation` takes a
    `tokenizer`, it takes a `Sides` too: sources are tokenized with `source`,
    and targets (prefixes, scored translations) tokenized and outputs
    detokenized with `target`.
    """

    source: object
    target: object


def sides(tokenizer):
    """`(source, target)` tokenizers: a `Sides`' two, or one tokenizer serving both sides."""
    return tuple(tokenizer) if isinstance(tokenizer, Sides) else (tokenizer, tokenizer)


def load_tokenizers(model_path):
    """A run's tensorflow-text tokenizers: one, or a `Sides` where it has one a side; each
    keeps language codes whole where its vocabulary has them (`LanguageCodes`).

    Args:
        model_path: str, the run's (source or shared) `.model` file; the
            target's is found beside it (`target_vocabulary_path`).
    """
    from pipelines.data.language_codes import LanguageCodes, has_language_codes

    def load(path):  # language codes kept whole where the vocabulary has them
        tokenizer = load_tokenizer(path)
        return LanguageCodes(tokenizer) if has_language_codes(path) else tokenizer

    target = target_vocabulary_path(model_path)
    if target == model_path:
        return load(model_path)
    return Sides(load(model_path), load(target))


def vocabulary_size(model_path):
    """Returns the number of pieces in a SentencePiece model file.

    Args:
        model_path: str, a SentencePiece `.model` file.

    Returns:
        int, the vocabulary size a model on this vocabulary needs.
    """
    return spm.SentencePieceProcessor(model_file=model_path).get_piece_size()


def special_ids(model_path):
    """The padding, start and end ids a SentencePiece model file reserves.

    The model is built with these (`Transformer(**special_ids(path))`), so the
    vocabulary is the one source of the special ids; `check_special_ids`
    confirms a trained model agrees before it is exported.

    Returns:
        dict with int `pad_id`, `bos_id`, `eos_id`.
    """
    processor = spm.SentencePieceProcessor(model_file=model_path)
    # A vocabulary without a start piece (an imported Marian model's) starts
    # decoding with the padding piece.
    bos = processor.bos_id() if processor.bos_id() >= 0 else processor.pad_id()
    return {"pad_id": processor.pad_id(), "bos_id": bos, "eos_id": processor.eos_id()}


def check_special_ids(model, model_path):
    """Raises `DataError` if `model`'s special ids differ from the vocabulary's.

    Args:
        model: a `Transformer` (or anything with `pad_id`, `bos_id`, `eos_id`).
        model_path: str, the SentencePiece model it was trained with.
    """
    expected = special_ids(model_path)
    missing = [name for name in expected if not hasattr(model, name)]
    if missing:
        raise DataError(
            f"the model has no {missing[0]}: not a keras_transformer Transformer "
            f"({type(model).__name__})"
        )
    found = {name: getattr(model, name) for name in expected}
    if found != expected:
        raise DataError(
            f"the model's special ids {found} differ from those of {model_path} {expected}: "
            "was it trained with another vocabulary?"
        )
