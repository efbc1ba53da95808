"""Penn Treebank trees: reading, cleaning, and the linearisation the model learns.

The treebank is read from any folder holding `wsj_NNNN.mrg` files: NLTK's
sample (`combined/wsj_0001.mrg`) or the full WSJ treebank
(`parsed/mrg/wsj/SS/wsj_SSNN.mrg`), with nltk's s-expression reader and
`Tree` (its `BracketParseCorpusReader` reads only below nltk's data folders). `clean` removes what a
parser is not asked to predict: empty elements (`-NONE-`), the constituents
they leave empty, function tags and indices (`NP-SBJ-1` -> `NP`).

Linearisation follows Vinyals et al. (2015), as the paper does: the source
is the words; the target is the tree depth-first, `(LABEL` opening and
`)LABEL` closing a constituent, each word replaced by its POS tag or by the
placeholder `XX`. `delinearize` puts the words back and repairs output that
is not a tree.
"""

import os
import re

from nltk.corpus.reader.util import read_sexpr_block
from nltk.tree import Tree

ROOT = "TOP"
PLACEHOLDER = "XX"
EMPTY = "-NONE-"
FILE_NAME = re.compile(r"wsj_(\d{4})\.mrg$")

# Contiguous by file number: the split this package documents for NLTK's
# sample (WSJ 0001-0199); the test files are not in the sample NLTK ships.
SPLITS = {"train": (1, 141), "dev": (142, 172), "test": (173, 199)}


def treebank_files(root, split=None):
    """The `wsj_NNNN.mrg` files under `root`, in file-number order, optionally one split's.

    Args:
        root: str, a folder searched recursively.
        split: None, a name in `SPLITS`, or `(first, last)` file numbers.

    Returns:
        list of paths relative to `root`.
    """
    low, high = SPLITS[split] if isinstance(split, str) else (split or (0, 10**4))
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            match = FILE_NAME.search(name)
            if match and low <= int(match.group(1)) <= high:
                found.append(
                    (int(match.group(1)), os.path.relpath(os.path.join(folder, name), root))
                )
    return [path for _, path in sorted(found)]


def read_trees(root, split=None):
    """Cleaned trees of a split, in file order.

    Returns:
        list of `nltk.Tree`, each rooted at `TOP`.
    """
    trees = []
    for path in treebank_files(root, split):
        with open(os.path.join(root, path), encoding="utf-8") as handle:
            while block := read_sexpr_block(handle):
                trees.extend(clean(Tree.fromstring(text)) for text in block)
    return trees


def strip_label(label):
    """`NP-SBJ-1` -> `NP`, `NP=2` -> `NP`; labels such as `-LRB-` and `-NONE-` are kept."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def clean(tree):
    """A copy without empty elements, emptied constituents, function tags; rooted at `TOP`.

    Args:
        tree: `nltk.Tree`, as the reader gives it (an unlabelled root or not).

    Returns:
        `nltk.Tree` `(TOP ...)`.
    """

    def walk(node):
        if isinstance(node, str):
            return node
        if node.label() == EMPTY:
            return None
        children = [child for child in (walk(c) for c in node) if child is not None]
        if not children:
            return None
        return Tree(strip_label(node.label()), children)

    children = [walk(child) for child in tree] if tree.label() in ("", ROOT) else [walk(tree)]
    return Tree(ROOT, [child for child in children if child is not None])


def is_preterminal(node):
    return isinstance(node, Tree) and len(node) == 1 and isinstance(node[0], str)


def linearize(tree, pos_tags=False):
    """Target tokens of a tree: `(S (NP XX XX )NP ... )S`, the root `TOP` left out.

    Args:
        tree: a cleaned `nltk.Tree`.
        pos_tags: bool, keep each word's POS tag instead of the placeholder.

    Returns:
        list of str.
    """
    tokens = []

    def walk(node):
        if is_preterminal(node):
            tokens.append(node.label() if pos_tags else PLACEHOLDER)
            return
        tokens.append(f"({node.label()}")
        for child in node:
            walk(child)
        tokens.append(f"){node.label()}")

    for child in tree if tree.label() == ROOT else [tree]:
        walk(child)
    return tokens


def delinearize(tokens, words):
    """The tree a token sequence describes, with `words` at its leaves, repaired if need be.

    Repairs, each counted: a closing bracket with nothing open is dropped; a
    word token beyond the words is dropped; brackets still open at the end
    are closed; words left over are attached to the root as `(XX word)`;
    constituents left without words are dropped. A closing bracket closes
    the innermost open constituent whatever its label.

    Args:
        tokens: list of str, the model's output (`linearize`'s vocabulary).
        words: list of str, the sentence.

    Returns:
        `(tree, repairs)`: an `nltk.Tree` rooted at `TOP` whose leaves are
        exactly `words`, and the number of repairs made.
    """
    repairs = 0
    stack = [Tree(ROOT, [])]
    position = 0
    for token in tokens:
        if token.startswith("(") and len(token) > 1:
            node = Tree(token[1:], [])
            stack[-1].append(node)
            stack.append(node)
        elif token.startswith(")"):
            if len(stack) > 1:
                stack.pop()
            else:
                repairs += 1
        elif position < len(words):
            stack[-1].append(Tree(token, [words[position]]))
            position += 1
        else:
            repairs += 1
    repairs += len(stack) - 1
    if position < len(words):
        repairs += 1
        stack[0].extend(Tree(PLACEHOLDER, [word]) for word in words[position:])

    def prune(node):
        if is_preterminal(node):
            return node
        children = [child for child in (prune(c) for c in node) if child is not None]
        return Tree(node.label(), children) if children else None

    tree = prune(stack[0])
    if tree is None or len(tree) == 0:
        tree = Tree(ROOT, [])
    dropped = _count_constituents(stack[0]) - _count_constituents(tree)
    return tree, repairs + dropped


def _count_constituents(tree):
    return sum(1 for _ in tree.subtrees())


def to_bracketed(tree):
    """One line: `(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks))))`."""
    return tree.pformat(margin=10**9)


def right_branching(words):
    """The right-branching baseline: `(TOP (S (XX w1) (S (XX w2) ... )))`, POS placeholders."""
    node = Tree("S", [Tree(PLACEHOLDER, [words[-1]])]) if words else None
    for word in reversed(words[:-1]):
        node = Tree("S", [Tree(PLACEHOLDER, [word]), node])
    return Tree(ROOT, [node] if node is not None else [])
