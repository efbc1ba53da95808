"""A SentencePiece model whose ids are another vocabulary's: one file where Marian has two.

A Marian tokenizer segments with one side's SentencePiece model, then looks
each piece up in a vocabulary (`vocab.json`) for the model's ids. Written as
one SentencePiece model, the same mapping runs wherever ours do: in
tensorflow-text inside the SavedModel, in tf.data, in CTranslate2's converter.
"""

from google.protobuf.message import DecodeError

from pipelines.errors import DataError


def merged_vocabulary(spm_path, vocabulary, size, special_ids):
    """A SentencePiece model that segments as `spm_path` does and numbers pieces as `vocabulary`.

    A Marian tokenizer segments with one side's SentencePiece model, then
    looks each piece up in the vocabulary. The same is one SentencePiece
    model: the vocabulary's pieces in id order, each with the score and type
    `spm_path` gives it, and those `spm_path` does not have marked unused (so
    segmentation never picks them: another side's pieces, ids without a piece).
    The unknown piece decodes to nothing, as `skip_special_tokens` does.

    Args:
        spm_path: str, Marian's `source.spm` or `target.spm`.
        vocabulary: dict, `{piece: id}`.
        size: int, the model's vocabulary size (ids beyond `vocabulary`'s are unused).
        special_ids: dict with int `unk_id`, `eos_id`, `pad_id`.

    Returns:
        bytes, a SentencePiece model file.

    Raises:
        DataError: `spm_path` is not a SentencePiece model, or makes a piece
            the vocabulary lacks (the two would segment differently).
    """
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    pieces = model_pb2.ModelProto.SentencePiece
    proto = model_pb2.ModelProto()
    try:
        with open(spm_path, "rb") as handle:
            proto.ParseFromString(handle.read())
    except (OSError, DecodeError) as error:
        raise DataError(f"{spm_path}: not a SentencePiece model ({error})") from None
    if not proto.pieces:
        raise DataError(f"{spm_path}: not a SentencePiece model (no pieces)")
    usable = (pieces.NORMAL, pieces.USER_DEFINED, pieces.BYTE)
    known = {p.piece: p for p in proto.pieces if p.type in usable}
    missing = [piece for piece in known if piece not in vocabulary]
    if missing:
        raise DataError(
            f"{spm_path}: {len(missing)} of its pieces are not in the vocabulary "
            f"(such as {missing[:3]}), which a Marian tokenizer maps to <unk>; this import "
            "needs every piece in the vocabulary"
        )
    by_id = {index: piece for piece, index in vocabulary.items()}
    merged = model_pb2.ModelProto()
    merged.CopyFrom(proto)
    del merged.pieces[:]
    for index in range(size):
        entry = merged.pieces.add(piece=by_id.get(index, f"<unused-{index}>"), score=0.0)
        if index == special_ids["unk_id"]:
            entry.type = pieces.UNKNOWN
        elif index in (special_ids["eos_id"], special_ids["pad_id"]):
            entry.type = pieces.CONTROL
        elif entry.piece in known:
            entry.type, entry.score = known[entry.piece].type, known[entry.piece].score
        else:
            entry.type = pieces.UNUSED
    spec = merged.trainer_spec
    spec.vocab_size = size
    spec.unk_id, spec.eos_id = special_ids["unk_id"], special_ids["eos_id"]
    spec.pad_id, spec.bos_id = special_ids["pad_id"], -1
    spec.unk_piece, spec.eos_piece = by_id[spec.unk_id], by_id[spec.eos_id]
    spec.pad_piece = by_id[spec.pad_id]
    spec.unk_surface = ""
    return merged.SerializeToString()
