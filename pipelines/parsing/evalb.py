"""Labelled bracket scoring with EVALB's conventions (Sekine and Collins, COLLINS.prm).

What COLLINS.prm sets, and this scorer follows:
- brackets labelled TOP are not counted (`DELETE_LABEL TOP`);
- words tagged `-NONE-`, `,`, `:`, ````, `''` or `.` are removed before spans
  are computed (`DELETE_LABEL`), and a bracket left covering no word is not
  counted;
- labels are cut at their first `-` or `=` (`NP-SBJ=2` -> `NP`), and ADVP and
  PRT count as one label (`EQ_LABEL ADVP PRT`);
- a sentence's length, for the 40-word cut (`CUTOFF_LEN 40`), counts every
  word but `-NONE-` ones (`DELETE_LABEL_FOR_LENGTH`), punctuation included;
- brackets are a multiset: a unary chain `(NP (NP ...))` is two brackets,
  and each gold bracket matches at most one test bracket;
- an exact match is a sentence whose gold, test and matched counts agree.

One difference: EVALB removes each tree's words by that tree's own tags, so
a parse that tags punctuation otherwise (or with a placeholder) has another
length and is skipped as an error. Here the gold tree's tags decide which
word positions are removed from both trees, so parses with placeholder tags
are scored; where the test tags agree the result is EVALB's. Why not a
package: no PyPI scorer follows these conventions without a heavy stack
(PYEVALB ignores them; supar needs torch, transformers and stanza).
"""

import collections
import dataclasses

from nltk.tree import Tree

DELETED_LABELS = {"TOP"}
DELETED_WORD_TAGS = {"-NONE-", ",", ":", "``", "''", "."}
LENGTH_IGNORED_TAGS = {"-NONE-"}
EQUAL_LABELS = {"PRT": "ADVP"}
CUTOFF_LENGTH = 40


def _label(label):
    for position, character in enumerate(label):
        if character in "-=":
            label = label[:position]
            break
    return EQUAL_LABELS.get(label, label)


def _words(tree):
    """`(word, tag)` of each leaf, in order."""
    return [(leaf, tag) for leaf, tag in tree.pos()]


def brackets(tree, deleted_positions):
    """The multiset of `(label, start, end)` brackets of a tree.

    Args:
        tree: `nltk.Tree`.
        deleted_positions: set of int, word positions removed before spans
            are computed.

    Returns:
        `collections.Counter` of `(label, start, end)`, end exclusive, over
        the words that remain.
    """
    counts = collections.Counter()
    position = [0, 0]  # [word position in the tree, position among kept words]

    def walk(node):
        if isinstance(node[0], str) and len(node) == 1:  # preterminal
            if position[0] not in deleted_positions:
                position[1] += 1
            position[0] += 1
            return
        start = position[1]
        for child in node:
            walk(child)
        label = _label(node.label())
        if (
            position[1] > start
            and label not in DELETED_LABELS
            and node.label() not in DELETED_LABELS
        ):
            counts[(label, start, position[1])] += 1

    walk(tree)
    return counts


@dataclasses.dataclass
class Counts:
    """Bracket and sentence counts, summed over sentences."""

    sentences: int = 0
    gold: int = 0
    test: int = 0
    matched: int = 0
    exact: int = 0

    def add(self, gold, test, matched):
        self.sentences += 1
        self.gold, self.test, self.matched = (
            self.gold + gold,
            self.test + test,
            self.matched + matched,
        )
        self.exact += gold == test == matched

    def scores(self):
        """`{"precision", "recall", "f1", "exact_match", "sentences"}`, percentages."""
        precision = 100.0 * self.matched / self.test if self.test else 0.0
        recall = 100.0 * self.matched / self.gold if self.gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        exact = 100.0 * self.exact / self.sentences if self.sentences else 0.0
        return {
            "precision": round(precision, 2),
            "recall": round(recall, 2),
            "f1": round(f1, 2),
            "exact_match": round(exact, 2),
            "sentences": self.sentences,
        }


def score_trees(gold_trees, test_trees):
    """Labelled precision, recall, F1 and exact match, over all sentences and those of <= 40 words.

    Args:
        gold_trees, test_trees: aligned lists of `nltk.Tree` over the same words.

    Returns:
        `{"all": scores, "len<=40": scores}`, each `Counts.scores()`.

    Raises:
        ValueError: naming the first sentence whose words differ.
    """
    if len(gold_trees) != len(test_trees):
        raise ValueError(f"{len(gold_trees)} gold trees but {len(test_trees)} test trees")
    totals, short = Counts(), Counts()
    for number, (gold, test) in enumerate(zip(gold_trees, test_trees, strict=True), start=1):
        gold_words, test_words = _words(gold), _words(test)
        if [w for w, _ in gold_words] != [w for w, _ in test_words]:
            raise ValueError(
                f"sentence {number}: the test tree's words differ from the gold tree's"
            )
        deleted = {i for i, (_, tag) in enumerate(gold_words) if tag in DELETED_WORD_TAGS}
        gold_brackets, test_brackets = brackets(gold, deleted), brackets(test, deleted)
        matched = sum((gold_brackets & test_brackets).values())
        counts = (sum(gold_brackets.values()), sum(test_brackets.values()), matched)
        totals.add(*counts)
        length = sum(1 for _, tag in gold_words if tag not in LENGTH_IGNORED_TAGS)
        if length <= CUTOFF_LENGTH:
            short.add(*counts)
    return {"all": totals.scores(), "len<=40": short.scores()}


def read_bracketed(line):
    """A tree from one line of bracketed text; an unlabelled root becomes TOP."""
    tree = Tree.fromstring(line)
    if tree.label() == "":
        tree.set_label("TOP")
    return tree
