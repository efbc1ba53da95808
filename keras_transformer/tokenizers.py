"""Text to the model's ids and back: a SentencePiece vocabulary with the ids the model expects.

    tokenizer = train_sentencepiece(lines, "vocab.model", vocabulary_size=8000)
    source_ids = tokenizer.encode_sources(["A dog runs."])           # (B, S) int32
    decoder_inputs, labels = tokenizer.encode_targets(["Ein Hund rennt."])
    texts = tokenizer.decode(greedy_search(model, source_ids))      # list of str

The model, its searches and `kt export` take padding 0, unknown 1, start 2
and end 3 (`SPECIAL_IDS`); SentencePiece's own defaults number them otherwise
(unknown 0, start 1, end 2, no padding), which `kt export` refuses. Training
here sets them. Arrays are NumPy, so the tokenizer serves every Keras backend
and needs only the `sentencepiece` package, not TensorFlow (keras-hub's
`SentencePieceTokenizer` runs on tensorflow-text, and takes SentencePiece's
ids as they are). The files are ordinary SentencePiece models: `kt export
--model MODEL.keras --sentencepiece FILE --max-source-length N` serves a model
trained with one (N: the `max_length` its sources were cut to).
"""

import io
import os

import numpy as np
from keras import ops

__all__ = [
    "SPECIAL_IDS",
    "SentencePieceTokenizer",
    "sentencepiece_model_bytes",
    "train_sentencepiece",
]

# The ids the model and `kt export` expect, in SentencePiece's training options' names.
SPECIAL_IDS = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise ImportError(
            "keras_transformer.tokenizers needs the sentencepiece package: "
            'pip install sentencepiece (or "keras-aiayn[tokenizers]")'
        ) from None
    return sentencepiece


def train_sentencepiece(
    texts=None,
    model_path="sentencepiece.model",
    vocabulary_size=8000,
    files=None,
    model_type="bpe",
    character_coverage=1.0,
    **options,
):
    """Trains a SentencePiece vocabulary with the model's special ids.

    Args:
        texts: iterable of str (sources and targets together for a shared
            vocabulary), read as a stream; or None with `files`.
        model_path: str, the `.model` file to write.
        vocabulary_size: int, pieces, the four special ones included.
        files: list of str, plain text files, one sentence a line, instead
            of `texts`.
        model_type: "bpe" (the paper's) or "unigram".
        character_coverage: float, the share of characters covered.
        **options: more `SentencePieceTrainer.train` options (such as
            `byte_fallback=True`, `split_digits=True`, `input_sentence_size`).

    Returns:
        a `SentencePieceTokenizer` of the written file.

    Raises:
        ValueError: neither or both of `texts` and `files`, a special id
            given in `options`, or nothing to train on.
    """
    data = sentencepiece_model_bytes(
        texts, vocabulary_size, files, model_type, character_coverage, **options
    )
    os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
    with open(model_path, "wb") as handle:  # written only once trained
        handle.write(data)
    return SentencePieceTokenizer(model_path)


def sentencepiece_model_bytes(
    texts=None,
    vocabulary_size=8000,
    files=None,
    model_type="bpe",
    character_coverage=1.0,
    **options,
):
    """A trained SentencePiece model file's bytes, with the model's special ids.

    What `train_sentencepiece` writes (its arguments but the path), for a
    caller that writes the file its own way.

    Returns:
        bytes, a `.model` file.

    Raises:
        ValueError: as `train_sentencepiece`.
    """
    if (texts is None) == (files is None):
        raise ValueError("train_sentencepiece takes texts or files, one of the two")
    given = sorted(
        set(options) & {*SPECIAL_IDS, "pad_piece", "unk_piece", "bos_piece", "eos_piece"}
    )
    if given:
        raise ValueError(f"the special ids are the model's {SPECIAL_IDS}; do not set {given}")
    sentencepiece = _sentencepiece()
    source = {"input": ",".join(files)} if files else {"sentence_iterator": _nonempty(texts)}
    buffer = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            **source, model_writer=buffer, vocab_size=vocabulary_size, model_type=model_type,
            character_coverage=character_coverage, minloglevel=2, **SPECIAL_IDS, **options,
        )  # fmt: skip
    except RuntimeError as error:
        raise ValueError(f"SentencePiece training failed: {error}") from None
    return buffer.getvalue()


def _nonempty(texts):
    for text in texts:
        if text:
            yield text


class SentencePieceTokenizer:
    """A SentencePiece model as the model's arrays: sources, targets, and text back.

    Args:
        model_path: str, a `.model` file whose padding, unknown, start and
            end ids are `SPECIAL_IDS` (`train_sentencepiece` writes such).

    Raises:
        ValueError: the file numbers its special pieces otherwise.
    """

    def __init__(self, model_path):
        self.model_path = model_path
        self.processor = _sentencepiece().SentencePieceProcessor(model_file=model_path)
        found = {
            "pad_id": self.processor.pad_id(),
            "unk_id": self.processor.unk_id(),
            "bos_id": self.processor.bos_id(),
            "eos_id": self.processor.eos_id(),
        }
        if found != SPECIAL_IDS:
            raise ValueError(
                f"{model_path}: special ids {found}, not the model's {SPECIAL_IDS}; "
                "train the vocabulary with keras_transformer.tokenizers.train_sentencepiece"
            )
        self.pad_id, self.unk_id = SPECIAL_IDS["pad_id"], SPECIAL_IDS["unk_id"]
        self.bos_id, self.eos_id = SPECIAL_IDS["bos_id"], SPECIAL_IDS["eos_id"]

    @property
    def vocabulary_size(self):
        """int, the pieces (`Transformer(vocabulary_size=...)`)."""
        return self.processor.get_piece_size()

    def encode(self, texts):
        """list of str -> list of lists of piece ids (no start or end)."""
        return self.processor.encode(list(texts))

    def encode_sources(self, texts, max_length=None):
        """Source ids as the encoder takes them: pieces, then the end id, then padding.

        Args:
            texts: list of str, `B` sentences.
            max_length: int or None, the most ids a row keeps, the end included.

        Returns:
            int32 NumPy `(B, S)`, `S` the longest row.
        """
        rows = [ids[: max_length - 1] if max_length else ids for ids in self.encode(texts)]
        return self._padded([ids + [self.eos_id] for ids in rows])

    def encode_targets(self, texts, max_length=None):
        """Decoder inputs and labels: start + pieces, and pieces + end (shifted by one).

        Args:
            texts: list of str, `B` sentences.
            max_length: int or None, the most ids a row keeps (the start or
                end included).

        Returns:
            `(decoder_inputs, labels)`: int32 NumPy `(B, T)` each, padded with
            `pad_id` (which the loss leaves out).
        """
        rows = [ids[: max_length - 1] if max_length else ids for ids in self.encode(texts)]
        inputs = self._padded([[self.bos_id] + ids for ids in rows])
        return inputs, self._padded([ids + [self.eos_id] for ids in rows])

    def decode(self, token_ids):
        """Search output back to text: each row up to its end id, padding and start dropped.

        Args:
            token_ids: int `(B, T)` array or tensor of any backend (or a
                list of lists), as `greedy_search` returns them; `(B, N, T)`
                beam hypotheses give a list of `N`-lists.

        Returns:
            list of str (of lists of str for `(B, N, T)`).
        """
        if not isinstance(token_ids, list):  # a list may be ragged
            token_ids = np.asarray(ops.convert_to_numpy(token_ids)).tolist()
        if token_ids and token_ids[0] and isinstance(token_ids[0][0], list):  # (B, N, T)
            return [self.decode(row) for row in token_ids]
        texts = []
        for row in token_ids:
            if self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            kept = [i for i in row if i not in (self.pad_id, self.bos_id)]
            texts.append(self.processor.decode(kept))
        return texts

    def _padded(self, rows):
        width = max((len(row) for row in rows), default=0)
        array = np.full((len(rows), width), self.pad_id, dtype="int32")
        for index, row in enumerate(rows):
            array[index, : len(row)] = row
        return array
