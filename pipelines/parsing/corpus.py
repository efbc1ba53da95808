"""The parsing task as sentence pairs, and model outputs back as scored trees.

A treebank split becomes `(words, linearised tree)` pairs, which train, batch
and export exactly as translation pairs do; `parse_lines` turns the model's
linearised output back into bracketed trees over the input words.
"""

from pipelines.errors import DataError
from pipelines.parsing import evalb, trees


def treebank_pairs(root, split, pos_tags=False):
    """`(sentence, target)` pairs of a split: the words, and the tree linearised.

    Args:
        root: str, a folder of `wsj_NNNN.mrg` files (any layout).
        split: a name in `trees.SPLITS`, or `(first, last)` file numbers.
        pos_tags: bool, keep POS tags in the targets instead of `XX`.

    Returns:
        `(pairs, gold)`: list of `(str, str)`, space-separated; and the
        cleaned gold trees, aligned. Both are empty when the folder has no
        file of the split.
    """
    gold = trees.read_trees(root, split)
    pairs = [(" ".join(tree.leaves()), " ".join(trees.linearize(tree, pos_tags))) for tree in gold]
    return pairs, gold


def target_tokens(pairs):
    """The distinct space-separated tokens of the targets of `pairs` (sorted list of str)."""
    return sorted({token for _, target in pairs for token in target.split()})


def parse_lines(linearised, sentences):
    """Trees from the model's linearised outputs, over the input sentences' words.

    Args:
        linearised: list of str, one output a sentence.
        sentences: list of str, the inputs, words separated by spaces.

    Returns:
        `(trees, repaired)`: list of `nltk.Tree` rooted at `TOP` whose
        leaves are each sentence's words, and the number of outputs that
        needed a repair (see `trees.delinearize`).
    """
    parsed, repaired = [], 0
    for output, sentence in zip(linearised, sentences, strict=True):
        tree, repairs = trees.delinearize(output.split(), sentence.split())
        parsed.append(tree)
        repaired += repairs > 0
    return parsed, repaired


def parse_scores(linearised, gold):
    """EVALB-style scores of linearised outputs against gold trees, and the repair rate.

    Args:
        linearised: list of str, the model's outputs, aligned with `gold`.
        gold: list of cleaned `nltk.Tree`.

    Returns:
        dict: `f1`, `precision`, `recall`, `exact_match` over all sentences,
        `f1_len<=40`, `repaired` (outputs repaired) and `repaired_percent`.
    """
    if len(linearised) != len(gold):
        raise DataError(f"{len(linearised)} parses for {len(gold)} gold trees")
    parsed, repaired = parse_lines(linearised, [" ".join(tree.leaves()) for tree in gold])
    scores = evalb.score_trees(gold, parsed)
    result = {key: scores["all"][key] for key in ("f1", "precision", "recall", "exact_match")}
    result["f1_len<=40"] = scores["len<=40"]["f1"]
    result["repaired"] = repaired
    result["repaired_percent"] = round(100.0 * repaired / max(len(gold), 1), 2)
    return result
