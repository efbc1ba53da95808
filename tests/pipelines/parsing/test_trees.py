"""Treebank reading, cleaning, linearisation and repair."""

import os

import pytest
from nltk.tree import Tree

from pipelines.parsing.trees import (
    MAX_DEPTH,
    clean,
    delinearize,
    linearize,
    read_trees,
    right_branching,
    to_bracketed,
    treebank_files,
    word_tags,
)
from tests.pipelines.conftest import shared_data

TREE_LINE = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"
TREE = Tree.fromstring(TREE_LINE)


@pytest.fixture(scope="module")
def treebank():
    return shared_data("treebank")


def test_cleaning_removes_empty_elements_function_tags_and_emptied_constituents():
    raw = Tree.fromstring(
        "( (S (NP-SBJ-1 (-NONE- *)) (VP (VBD said) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))"
        " (NP=2 (-LRB- -LRB-) (NN x) (-RRB- -RRB-))) (. .)) )"
    )
    assert to_bracketed(clean(raw)) == (
        "(TOP (S (VP (VBD said) (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-))) (. .)))"
    )


def test_linearisation_is_depth_first_with_labelled_brackets():
    assert " ".join(linearize(TREE)) == "(S (NP XX XX )NP (VP XX )VP XX )S"
    assert " ".join(linearize(TREE, pos_tags=True)) == "(S (NP DT NN )NP (VP VBZ )VP . )S"


def test_linearisation_with_words_writes_each_word_before_its_tag():
    assert " ".join(linearize(TREE, pos_tags=True, words=True)) == (
        "(S (NP The DT dog NN )NP (VP barks VBZ )VP . . )S"
    )
    tokens = linearize(TREE, pos_tags=True, words=True)
    assert delinearize(tokens, TREE.leaves(), with_words=True) == (TREE, 0)


@pytest.mark.parametrize(
    "tokens, expected, repairs",
    [
        # A written word that is a tag is read as a word (a word comes first), and differs.
        ("(S (NP The NN DT NN )NP )S", "(TOP (S (NP (NN The) (NN dog))) (XX barks) (XX .))", 2),
        # A word other than the sentence's, and a word without its tag.
        ("(S (NP The DT cat NN )NP (VP barks )VP . . )S",
         "(TOP (S (NP (DT The) (NN dog)) (VP (XX barks)) (. .)))", 2),
        # Characters the vocabulary does not know come back as " ⁇ ": the same word.
        ("(S (NP The DT d \u2047 g NN )NP (VP barks VBZ )VP . . )S", TREE_LINE, 0),
        ("(S (NP The DT d \u2047 x NN )NP (VP barks VBZ )VP . . )S", TREE_LINE, 1),
        # A last word without its tag; words beyond the sentence; nothing at all.
        ("(S (NP The DT dog NN )NP (VP barks VBZ )VP . )S",
         "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (XX .)))", 1),
        ("(S (NP The DT dog NN )NP (VP barks VBZ )VP . . a DT )S", TREE_LINE, 1),
        ("", "(TOP (XX The) (XX dog) (XX barks) (XX .))", 1),
    ],
)  # fmt: skip
def test_output_with_words_is_read_word_then_tag_and_repaired(tokens, expected, repairs):
    tree, count = delinearize(tokens.split(), TREE.leaves(), {"DT", "NN", "VBZ", "."}, True)
    assert to_bracketed(tree) == expected and count == repairs


def test_output_that_is_a_tree_needs_no_repair():
    tree, repairs = delinearize(linearize(TREE, pos_tags=True), TREE.leaves())
    assert tree == TREE and repairs == 0


@pytest.mark.parametrize(
    "tokens, expected, repairs",
    [
        # A stray closing bracket is dropped.
        (")S (S (NP XX XX )NP (VP XX )VP XX )S",
         "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks)) (XX .)))", 1),
        # Brackets left open are closed (two of them).
        ("(S (NP XX XX )NP (VP XX XX",
         "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks) (XX .))))", 2),
        # Words left over join the root.
        ("(S (NP XX XX )NP )S",
         "(TOP (S (NP (XX The) (XX dog))) (XX barks) (XX .))", 1),
        # Word tokens beyond the words are dropped, and the constituent left empty.
        ("(S (NP XX XX )NP (VP XX )VP XX (NP XX )NP )S",
         "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks)) (XX .)))", 2),
    ],
)  # fmt: skip
def test_broken_output_is_repaired_onto_the_words(tokens, expected, repairs):
    tree, count = delinearize(tokens.split(), TREE.leaves())
    assert to_bracketed(tree) == expected and count == repairs
    assert tree.leaves() == TREE.leaves()


def test_right_branching_baseline():
    assert to_bracketed(right_branching(["a", "b", "c"])) == (
        "(TOP (S (XX a) (S (XX b) (S (XX c)))))"
    )


def test_the_sample_splits_read_and_round_trip(treebank):
    train, dev = read_trees(treebank, "train"), read_trees(treebank, "dev")
    assert (len(train), len(dev)) == (3098, 427)
    assert read_trees(treebank, "test") == []  # kept aside
    assert max(len(linearize(tree)) for tree in train + dev) == 573
    for tree in dev:
        assert tree.label() == "TOP"
        assert not any(t.label() == "-NONE-" for t in tree.subtrees())
        rebuilt, repairs = delinearize(linearize(tree, pos_tags=True), tree.leaves())
        assert rebuilt == tree and repairs == 0


def test_the_full_treebank_layout_reads_too(treebank, tmp_path):
    """parsed/mrg/wsj/SS/wsj_SSNN.mrg, as the LDC distributes it."""
    folder = tmp_path / "parsed" / "mrg" / "wsj" / "01"
    folder.mkdir(parents=True)
    for number in (142, 143):
        name = f"wsj_0{number}.mrg"
        (folder / name).symlink_to(os.path.join(treebank, "combined", name))
    assert treebank_files(str(tmp_path), "dev") == [
        os.path.join("parsed", "mrg", "wsj", "01", "wsj_0142.mrg"),
        os.path.join("parsed", "mrg", "wsj", "01", "wsj_0143.mrg"),
    ]
    expected = read_trees(treebank, (142, 143))
    assert read_trees(str(tmp_path), "dev") == expected and len(expected) > 10


def test_word_tokens_outside_the_tags_and_brackets_in_labels_or_words_are_repaired():
    tags = word_tags(["(S", ")S", "(NP", ")NP", "DT", "NN", "VBZ", "."])
    assert tags == {"DT", "NN", "VBZ", "."}
    tokens = "(S (NP DT dog )NP (VP( VBZ )VP ( )S".split()
    tree, repairs = delinearize(tokens, ["The", "dog", "barks", "(sic)"], tags)
    # `dog` is no tag, `VP(` no label, `(` no tag: three repairs; the word's brackets escaped.
    assert repairs == 3
    line = to_bracketed(tree)
    assert line == "(TOP (S (NP (DT The) (XX dog)) (X (VBZ barks)) (XX -LRB-sic-RRB-)))"
    assert Tree.fromstring(line) == tree
    # Without tags any token without a bracket stands as a tag.
    assert delinearize("(S NN NN )S".split(), ["a", "b"])[1] == 0


def test_a_full_treebank_takes_the_standard_sections_as_splits(tmp_path):
    for section, number in (("00", 1), ("02", 200), ("21", 2199), ("22", 2200), ("23", 2301)):
        folder = tmp_path / "parsed" / "mrg" / "wsj" / section
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"wsj_{number:04d}.mrg").write_text("( (S (NN x)) )\n")
    names = lambda split: [os.path.basename(p) for p in treebank_files(str(tmp_path), split)]  # noqa: E731
    assert names("train") == ["wsj_0200.mrg", "wsj_2199.mrg"]  # sections 02-21, not 00
    assert names("dev") == ["wsj_2200.mrg"] and names("test") == ["wsj_2301.mrg"]
    assert names((1, 1)) == ["wsj_0001.mrg"]  # file numbers still choose any subset


def test_output_nested_beyond_the_depth_limit_is_repaired_not_a_recursion_error():
    tokens = ["(S"] + ["(NP"] * 900 + ["NN", "NN"] + [")NP"] * 900 + [")S"]
    tree, repairs = delinearize(tokens, ["a", "b"], {"NN"})
    assert tree.leaves() == ["a", "b"] and tree.height() <= MAX_DEPTH + 3
    assert repairs == 900 - (MAX_DEPTH - 1)  # the brackets opened beyond the limit
    assert Tree.fromstring(to_bracketed(tree)) == tree
