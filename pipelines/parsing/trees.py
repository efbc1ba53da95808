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

With `words=True` the target also writes each word before its tag:
`(S (NP The DT dog NN )NP ...`. The decoder then sees which word it has
reached instead of counting the tags it wrote, which a Transformer trained on
a few thousand trees does not learn (see docs/parsing.md); a search under the
copying tree constraint writes the words exactly as the source has them.
"""

import os
import re
import unicodedata

from nltk.corpus.reader.util import read_sexpr_block
from nltk.tree import Tree

ROOT = "TOP"
PLACEHOLDER = "XX"
# Deepest nesting `delinearize` builds (treebank trees stay far below it): deeper
# output would exceed Python's recursion limit in nltk's recursive tree code.
MAX_DEPTH = 100
EMPTY = "-NONE-"
# How SentencePiece writes back a piece it does not know.
UNKNOWN = "\u2047"
FILE_NAME = re.compile(r"wsj_(\d{4})\.mrg$")

# Contiguous by file number: the split this package documents for NLTK's
# sample (WSJ 0001-0199); the test files are not in the sample NLTK ships.
SPLITS = {"train": (1, 141), "dev": (142, 172), "test": (173, 199)}
# The full WSJ treebank's standard split (sections 02-21, 22, 23), used where
# a folder holds files beyond the sample's 0199.
WSJ_SPLITS = {"train": (200, 2199), "dev": (2200, 2299), "test": (2300, 2399)}


def treebank_files(root, split=None):
    """The `wsj_NNNN.mrg` files under `root`, in file-number order, optionally one split's.

    Args:
        root: str, a folder searched recursively.
        split: None, a name in `SPLITS`, or `(first, last)` file numbers.
            A name means the sample's split (`SPLITS`), or the standard
            WSJ split (`WSJ_SPLITS`: sections 02-21, 22, 23) where `root`
            holds any file numbered above 0199.

    Returns:
        list of paths relative to `root`.
    """
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            match = FILE_NAME.search(name)
            if match:
                found.append(
                    (int(match.group(1)), os.path.relpath(os.path.join(folder, name), root))
                )
    if isinstance(split, str):
        full = any(number > SPLITS["test"][1] for number, _ in found)
        low, high = (WSJ_SPLITS if full else SPLITS)[split]
    else:
        low, high = split or (0, 10**4)
    return [path for number, path in sorted(found) if low <= number <= high]


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


def word_tags(tokens):
    """The tokens of a target vocabulary that stand for words: all but brackets (set of str)."""
    return {token for token in tokens if not token.startswith(("(", ")"))}


def is_bracket(token):
    """Whether a target token opens or closes a constituent (`(NP`, `)NP`; bool)."""
    return token.startswith(("(", ")")) and len(token) > 1


def is_preterminal(node):
    return isinstance(node, Tree) and len(node) == 1 and isinstance(node[0], str)


def linearize(tree, pos_tags=False, words=False):
    """Target tokens of a tree: `(S (NP XX XX )NP ... )S`, the root `TOP` left out.

    Args:
        tree: a cleaned `nltk.Tree`.
        pos_tags: bool, keep each word's POS tag instead of the placeholder.
        words: bool, write each word before its tag (`(NP The DT dog NN )NP`).

    Returns:
        list of str.
    """
    tokens = []

    def walk(node):
        if is_preterminal(node):
            if words:
                tokens.append(node[0])
            tokens.append(node.label() if pos_tags else PLACEHOLDER)
            return
        tokens.append(f"({node.label()}")
        for child in node:
            walk(child)
        tokens.append(f"){node.label()}")

    for child in tree if tree.label() == ROOT else [tree]:
        walk(child)
    return tokens


def delinearize(tokens, words, tags=None, with_words=False):
    """The tree a token sequence describes, with `words` at its leaves, repaired if need be.

    Repairs, each counted: a closing bracket with nothing open is dropped; a
    word token beyond the words is dropped; a word token that is not a tag
    (not in `tags`, or holding a bracket) stands as `XX`; a label holding a
    bracket becomes `X`; brackets still open at the end are closed; words
    left over are attached to the root as `(XX word)`; constituents left
    without words are dropped. A closing bracket closes the innermost open
    constituent whatever its label. A bracket opened deeper than `MAX_DEPTH`
    is dropped with the bracket that closes it. Brackets in words are written as the
    treebank writes them (`-LRB-`, `-RRB-`), so the tree's line reads back.

    With `with_words`, the tokens between brackets alternate word, tag (as
    `linearize(..., words=True)` writes them); with `tags`, a written word
    runs on to the next tag (SentencePiece writes characters it does not know
    as ` ⁇ `). The leaf is the sentence's word and the written word's tag;
    also counted as repairs: a written word that is not the sentence's next
    word, and a word with no tag before the next bracket (it stands as `XX`).

    Args:
        tokens: list of str, the model's output (`linearize`'s vocabulary).
        words: list of str, the sentence.
        tags: set of str or None, the word tokens the model was trained on
            (POS tags, or `XX`); None accepts any token without a bracket.
        with_words: bool, the output writes each word before its tag.

    Returns:
        `(tree, repairs)`: an `nltk.Tree` rooted at `TOP` whose leaves are
        `words` (brackets escaped), and the number of repairs made.
    """
    repairs, skipped = 0, 0
    stack = [Tree(ROOT, [])]
    words = [escape_brackets(word) for word in words]
    position, pending = 0, None  # pending: a written word awaiting its tag

    def add_leaf(tag, written=None):
        nonlocal position, repairs
        if position >= len(words):
            repairs += 1  # beyond the words: dropped
            return
        if tag is None:  # a written word without its tag
            tag, repairs = PLACEHOLDER, repairs + 1
        elif "(" in tag or ")" in tag or (tags is not None and tag not in tags):
            tag, repairs = PLACEHOLDER, repairs + 1
        if written is not None and not _same_word(written, words[position]):
            repairs += 1
        stack[-1].append(Tree(tag, [words[position]]))
        position += 1

    for token in tokens:
        if is_bracket(token) and pending is not None:
            add_leaf(None, pending)
            pending = None
        if token.startswith("(") and len(token) > 1 and len(stack) > MAX_DEPTH:
            skipped, repairs = skipped + 1, repairs + 1  # dropped, with its closing bracket
        elif token.startswith("(") and len(token) > 1:
            label = token[1:]
            if "(" in label or ")" in label:
                label, repairs = "X", repairs + 1
            node = Tree(label, [])
            stack[-1].append(node)
            stack.append(node)
        elif token.startswith(")") and skipped:
            skipped -= 1
        elif token.startswith(")"):
            if len(stack) > 1:
                stack.pop()
            else:
                repairs += 1
        elif with_words and pending is None:
            pending = token
        elif with_words and tags is not None and token not in tags:
            # SentencePiece writes an unknown character as " ⁇ ": still the same word.
            pending = f"{pending} {token}"
        else:
            add_leaf(token, pending)
            pending = None
    if pending is not None:
        add_leaf(None, pending)
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


def escape_brackets(text):
    """`text` with brackets written as the treebank writes them (`-LRB-`, `-RRB-`; str)."""
    return text.replace("(", "-LRB-").replace(")", "-RRB-")


def _same_word(written, word):
    """Whether a word the model wrote is `word` as its vocabulary writes it back:
    normalised NFKC, with ` ⁇ ` for each run of characters it does not know."""
    parts = [
        unicodedata.normalize("NFKC", escape_brackets(part.strip()))
        for part in written.split(UNKNOWN)
    ]
    word = unicodedata.normalize("NFKC", escape_brackets(word))
    return re.fullmatch(".+".join(re.escape(part) for part in parts), word) is not None


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
