"""The parsing task as sentence pairs, and model outputs back as scored trees.

A treebank split becomes `(words, linearised tree)` pairs, which train, batch
and export exactly as translation pairs do; `parse_lines` turns the model's
linearised output back into bracketed trees over the input words.
"""

import os

from pipelines.errors import DataError
from pipelines.parsing import evalb, trees

# SentencePiece's mark of a word's start (`pipelines.data.tokenizer.WORD_MARK`,
# which imports TensorFlow; scoring trees needs none).
WORD_MARK = "\u2581"


def treebank_pairs(root, split, pos_tags=False, words=False):
    """`(sentence, target)` pairs of a split: the words, and the tree linearised.

    Args:
        root: str, a folder of `wsj_NNNN.mrg` files (any layout).
        split: a name in `trees.SPLITS`, or `(first, last)` file numbers.
        pos_tags: bool, keep POS tags in the targets instead of `XX`.
        words: bool, the targets write each word before its tag.

    Returns:
        `(pairs, gold)`: list of `(str, str)`, space-separated; and the
        cleaned gold trees, aligned. Both are empty when the folder has no
        file of the split.
    """
    gold = trees.read_trees(root, split)
    pairs = [
        (" ".join(tree.leaves()), " ".join(trees.linearize(tree, pos_tags, words))) for tree in gold
    ]
    return pairs, gold


def target_tokens(pairs, words=False):
    """The distinct tree tokens of the targets of `pairs` (sorted list of str).

    Args:
        pairs: list of `(sentence, target)` str pairs.
        words: bool, the targets write each word before its tag
            (`trees.linearize(..., words=True)`); the words are left out.

    Returns:
        sorted list of str: brackets and tags.
    """
    tokens = set()
    for _, target in pairs:
        target = target.split()
        leaves = [token for token in target if not trees.is_bracket(token)]
        tokens.update(token for token in target if trees.is_bracket(token))
        tokens.update(leaves[1::2] if words else leaves)
    return sorted(tokens)


def vocabulary_tags(sentencepiece_path):
    """The word tokens (tags or `XX`) a parser writes, or None if its vocabulary does not say.

    A vocabulary trained with `whole_target_tokens` holds each target token as
    a user-defined piece (`▁(NP`, `▁NN`); the tokens that are not brackets are
    the tags the model writes for words. A parser's vocabulary that also keeps
    source words whole (`whole_source_words`) lists its tags in a file beside
    it (`tags_path`), which is read instead.

    Args:
        sentencepiece_path: str, a `.model` file (an export's
            `assets/sentencepiece.model`).

    Returns:
        set of str, or None when the vocabulary keeps no token whole and
        lists no tags.
    """
    _, whole = _vocabulary(sentencepiece_path)
    return _tags(sentencepiece_path, whole) or None


def _tags(sentencepiece_path, whole):
    """The tags listed beside the vocabulary if it lists them, else those of `whole`
    (its whole tokens, as `_vocabulary` reads them); a set of str."""
    listed = tags_path(sentencepiece_path)
    if os.path.exists(listed):
        with open(listed, encoding="utf-8") as handle:
            return set(handle.read().split())
    return trees.word_tags(whole)


def tags_path(sentencepiece_path):
    """The file listing a parser vocabulary's tags, beside it (`x.model` -> `x.tags`)."""
    return os.path.splitext(sentencepiece_path)[0] + ".tags"


def _vocabulary(sentencepiece_path):
    """A SentencePiece model's pieces (list of str, by id) and the tokens it keeps
    whole, without the word mark (dict of str to id).

    Read from the model proto: sentencepiece's processor does not say which
    pieces are user-defined.
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(sentencepiece_path, "rb") as handle:
        proto.ParseFromString(handle.read())
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    pieces = [piece.piece for piece in proto.pieces]
    whole = {
        piece.piece.lstrip(WORD_MARK): i
        for i, piece in enumerate(proto.pieces)
        if piece.type == user_defined
    }
    return pieces, whole


def bracket_constraint(sentencepiece_path, eos_id, copy_words=False):
    """The search constraint for a parser trained with `whole_target_tokens`.

    Brackets (`▁(NP`, `▁)NP`) and tags (`vocabulary_tags`) are the
    vocabulary's user-defined pieces; every piece that begins with the word
    mark begins a source word, so a source's words are counted from its
    pieces.

    Args:
        sentencepiece_path: str, the run's (or the export's) `.model` file.
        eos_id: int, the model's end-of-sequence id.
        copy_words: bool, the parser writes each word before its tag
            (`data.treebank_words`): the search copies it from the source.

    Returns:
        a `keras_transformer.decoding.BracketConstraint`.

    Raises:
        DataError: the vocabulary keeps no tree token whole.
    """
    from keras_transformer.decoding import BracketConstraint

    pieces, whole = _vocabulary(sentencepiece_path)
    brackets = {
        i: whole[")" + token[1:]]
        for token, i in whole.items()
        if token.startswith("(") and ")" + token[1:] in whole
    }
    leaves = [whole[token] for token in _tags(sentencepiece_path, whole) if token in whole]
    if not brackets or not leaves:
        raise DataError(
            f"{sentencepiece_path} keeps no brackets or tags whole: was the parser trained "
            "with batching.whole_target_tokens?"
        )
    starts = [i for i, piece in enumerate(pieces) if piece.startswith(WORD_MARK)]
    # As deep as `trees.delinearize` reads without dropping brackets.
    return BracketConstraint(
        len(pieces),
        brackets,
        leaves,
        starts,
        eos_id,
        max_depth=trees.MAX_DEPTH,
        copy_words=copy_words,
    )


def parse_lines(linearised, sentences, tags=None, with_words=False):
    """Trees from the model's linearised outputs, over the input sentences' words.

    Args:
        linearised: list of str, one output a sentence.
        sentences: list of str, the inputs, words separated by spaces.
        tags: set of str or None, the word tokens the model was trained on
            (`vocabulary_tags`); any other word token is repaired to `XX`.
        with_words: bool, the outputs write each word before its tag.

    Returns:
        `(trees, repaired)`: list of `nltk.Tree` rooted at `TOP` whose
        leaves are each sentence's words, and the number of outputs that
        needed a repair (see `trees.delinearize`).
    """
    parsed, repaired = [], 0
    for output, sentence in zip(linearised, sentences, strict=True):
        tree, repairs = trees.delinearize(output.split(), sentence.split(), tags, with_words)
        parsed.append(tree)
        repaired += repairs > 0
    return parsed, repaired


def parse_scores(linearised, gold, tags=None, with_words=False):
    """EVALB-style scores of linearised outputs against gold trees, and the repair rate.

    Args:
        linearised: list of str, the model's outputs, aligned with `gold`.
        gold: list of cleaned `nltk.Tree`.
        tags: set of str or None, as `parse_lines` takes it.
        with_words: bool, as `parse_lines` takes it.

    Returns:
        dict: `f1`, `precision`, `recall`, `exact_match` over all sentences,
        `f1_len<=40`, `repaired` (outputs repaired) and `repaired_percent`.

    Raises:
        DataError: the two lists differ in length.
    """
    if len(linearised) != len(gold):
        raise DataError(f"{len(linearised)} parses for {len(gold)} gold trees")
    sentences = [" ".join(tree.leaves()) for tree in gold]
    parsed, repaired = parse_lines(linearised, sentences, tags, with_words)
    scores = evalb.score_trees(gold, parsed)
    result = {key: scores["all"][key] for key in ("f1", "precision", "recall", "exact_match")}
    result["f1_len<=40"] = scores["len<=40"]["f1"]
    result["repaired"] = repaired
    result["repaired_percent"] = round(100.0 * repaired / max(len(gold), 1), 2)
    return result
