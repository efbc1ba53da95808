"""Target-language codes of multilingual models (`>>fra<<`), kept whole as Marian keeps them.

A multilingual OPUS-MT model is told its target language by a code at the
start of the source, such as `>>fra<< Hello`, which its vocabulary holds as
one piece. `MarianTokenizer` (`remove_language_code`) takes a sentence's
start up to its first `<<` as that piece where the sentence starts with
`>>`, and segments the rest; SentencePiece alone would cut the code into
characters. `LanguageCodes` does the same as
`MarianTokenizer` inside a TensorFlow graph (the SavedModel), and
`split_language_code` in Python (CTranslate2's tokenization). Both apply only
to a vocabulary that has such pieces (`has_language_codes`).
"""

import re

import tensorflow as tf

# A code piece, and a sentence's leading code as `MarianTokenizer` finds it (to the first "<<").
CODE = ">>.+<<"
LEADING = ">>.*?<<"


def has_language_codes(sentencepiece_path):
    """Whether a SentencePiece model has language-code pieces (`>>fra<<`).

    Args:
        sentencepiece_path: str, a `.model` file.
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=sentencepiece_path)
    pattern = re.compile(CODE)
    return any(
        pattern.fullmatch(processor.id_to_piece(index))
        for index in range(processor.get_piece_size())
    )


def split_language_code(text):
    """`(code pieces, rest)` as `MarianTokenizer` splits a sentence.

    Args:
        text: str.

    Returns:
        `([code], the text after it)`, or `([], text)` where it starts with none.
    """
    match = re.match(LEADING, text, re.DOTALL)
    return ([match.group(0)], text[match.end() :]) if match else ([], text)


class LanguageCodes(tf.Module):
    """A tensorflow-text SentencePiece tokenizer that keeps a leading language code whole.

    `tokenize` gives a sentence starting with a code the code's id (the
    unknown id for a code the vocabulary lacks, as `MarianTokenizer` gives)
    followed by the pieces of the rest of the sentence; other methods are
    the wrapped tokenizer's.

    Args:
        tokenizer: a `tensorflow_text.SentencepieceTokenizer`.
    """

    def __init__(self, tokenizer):
        super().__init__(name="language_codes")
        self.tokenizer = tokenizer

    def tokenize(self, sentences):
        """String `(B,)` -> ragged ids `(B, None)`."""
        sentences = tf.convert_to_tensor(sentences, tf.string)
        coded = tf.strings.regex_full_match(sentences, f"(?s){LEADING}.*")  # (B,)
        codes = tf.strings.regex_replace(sentences, f"(?s)^({LEADING}).*", r"\1")
        rests = tf.strings.regex_replace(sentences, f"(?s)^{LEADING}", "", replace_global=False)
        pieces = self.tokenizer.tokenize(rests)
        ids = tf.cast(self.tokenizer.string_to_id(codes), pieces.dtype)  # (B,)
        column = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(ids, coded), tf.cast(coded, tf.int64)
        )  # (B, 0 or 1)
        return tf.concat([column, pieces], axis=1)

    def detokenize(self, ids):
        return self.tokenizer.detokenize(ids)

    def id_to_string(self, ids):
        return self.tokenizer.id_to_string(ids)

    def string_to_id(self, pieces):
        return self.tokenizer.string_to_id(pieces)
