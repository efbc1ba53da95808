"""Growing a trained SentencePiece vocabulary with the pieces new data needs.

A run started from a model (`init_from`) with `extend_vocabulary` N trains
an N-piece vocabulary on its own data, with the source's settings, and
appends each of its pieces that the source's vocabulary lacks after the
source's pieces, in the order SentencePiece ranked them. Every old piece
keeps its id, so every row of the source model's embedding keeps its
meaning; `spellings` says which old pieces the source wrote each new piece
with, and the model's new rows start as the mean of those rows.

OpenNMT-tf's `onmt-update-vocab` (merge mode) appends the new words in the
same way, but leaves their rows as freshly initialised (random) values. With
tied output embeddings a random row gives a new piece an arbitrary score from
the first step, where the mean of its old spelling gives it the score the
source already gave that text (the vocabulary transfer of Mosin et al., 2023).
"""

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from pipelines.data.tokenizer import WORD_MARK
from pipelines.errors import DataError

NORMAL = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL


def _read(path):
    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as handle:
        proto.ParseFromString(handle.read())
    return proto


def extended_model(model_path, new_model):
    """The vocabulary of `model_path` with the pieces of `new_model` it lacks appended.

    BPE scores rank merges: the appended pieces score below every old piece,
    in `new_model`'s order, so that the old merges still apply first.

    Args:
        model_path: str, the source's SentencePiece `.model` file.
        new_model: bytes, a SentencePiece model trained on the new data with
            the same model type and special ids.

    Returns:
        `(model_bytes, added)`: the serialized extended model, and the list
        of added pieces (str) in id order after the old ones.

    Raises:
        DataError: the two models are of different types.
    """
    old, new = _read(model_path), sentencepiece_model_pb2.ModelProto()
    new.ParseFromString(new_model)
    if old.trainer_spec.model_type != new.trainer_spec.model_type:
        raise DataError(
            f"extend_vocabulary: {model_path} is a {_type_name(old)} model, the new data's "
            f"vocabulary a {_type_name(new)} one"
        )
    known = {piece.piece for piece in old.pieces}
    lowest = min((piece.score for piece in old.pieces), default=0.0)
    added = [p for p in new.pieces if p.type == NORMAL and p.piece not in known]
    bpe = old.trainer_spec.model_type == old.trainer_spec.BPE
    for rank, piece in enumerate(added, start=1):
        score = lowest - rank if bpe else piece.score
        old.pieces.add(piece=piece.piece, score=score, type=NORMAL)
    old.trainer_spec.vocab_size = len(old.pieces)
    return old.SerializeToString(), [piece.piece for piece in added]


def _type_name(proto):
    return proto.trainer_spec.ModelType.Name(proto.trainer_spec.model_type).lower()


def model_type(model_path):
    """A SentencePiece `.model` file's type: "bpe", "unigram", "word" or "char"."""
    return _type_name(_read(model_path))


def pieces_used(model_bytes, sentences, first_id):
    """How many pieces from `first_id` on the model writes `sentences` with.

    An appended BPE piece is reached only where the old merges leave its two
    halves side by side; one that is never reached keeps its initial row.

    Args:
        model_bytes: bytes, a serialized SentencePiece model.
        sentences: iterable of str.
        first_id: int, the first appended id.

    Returns:
        int.
    """
    processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    used = set()
    for sentence in sentences:
        used.update(i for i in processor.encode(sentence) if i >= first_id)
    return len(used)


def spellings(model_path, pieces):
    """How the vocabulary at `model_path` writes each of `pieces`: its ids for the same text.

    A word-initial piece (`▁word`) is encoded as a word; another one as the
    inside of a word (the word mark SentencePiece adds before it is dropped
    where it stands alone). A character the vocabulary lacks is its `unk`
    id, or its UTF-8 bytes with `byte_fallback`.

    Args:
        model_path: str, the source's SentencePiece `.model` file.
        pieces: list of str, pieces the source lacks.

    Returns:
        list of non-empty lists of int, one a piece.
    """
    processor = spm.SentencePieceProcessor(model_file=model_path)
    mark = processor.piece_to_id(WORD_MARK)
    found = []
    for piece in pieces:
        inside = not piece.startswith(WORD_MARK)
        ids = processor.encode(piece.replace(WORD_MARK, " ").strip())
        if inside and len(ids) > 1 and ids[0] == mark and mark != processor.unk_id():
            ids = ids[1:]
        found.append(ids or [processor.unk_id()])
    return found
