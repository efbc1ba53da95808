"""A small treebank in the Penn Treebank's `.mrg` format, written for tests."""

import os
import random

DETERMINERS = ["the", "a", "every", "this"]
NOUNS = ["dog", "cat", "board", "director", "market", "share", "price", "company"]
VERBS = ["sees", "joins", "buys", "sells", "likes"]
PATTERNS = [
    "(S (NP-SBJ (DT {d1}) (NN {n1})) (VP (VBZ {v}) (NP (DT {d2}) (NN {n2}))) (. .))",
    "(S (NP-SBJ (DT {d1}) (NN {n1})) (VP (VBZ {v})) (. .))",
    "(S (NP-SBJ (DT {d1}) (NN {n1})) (VP (VBZ {v}) (NP (-NONE- *T*-1)) "
    "(PP (IN with) (NP (DT {d2}) (NN {n2})))) (. .))",
]


def tree_text(rng):
    """One raw tree, as the treebank's files hold it: `( (S ...) )`."""
    words = {
        "d1": rng.choice(DETERMINERS), "d2": rng.choice(DETERMINERS),
        "n1": rng.choice(NOUNS), "n2": rng.choice(NOUNS), "v": rng.choice(VERBS),
    }  # fmt: skip
    return "( " + rng.choice(PATTERNS).format(**words) + " )"


def write_treebank(root, files=((1, 60), (142, 12)), seed=0):
    """Writes `combined/wsj_NNNN.mrg` files of random trees under `root`.

    Args:
        root: path of the folder to write.
        files: `(file number, trees)` pairs; 1-141 are train, 142-172 dev.
        seed: int.

    Returns:
        str, `root`.
    """
    rng = random.Random(seed)
    folder = os.path.join(root, "combined")
    os.makedirs(folder, exist_ok=True)
    for number, count in files:
        with open(os.path.join(folder, f"wsj_{number:04d}.mrg"), "w", encoding="utf-8") as handle:
            handle.write("\n\n".join(tree_text(rng) for _ in range(count)) + "\n")
    return str(root)
