"""The parsing task as sentence pairs, and outputs scored as trees."""

import pytest

from pipelines.parsing.corpus import parse_lines, parse_scores, target_tokens, treebank_pairs
from pipelines.parsing.trees import read_trees, to_bracketed
from tests.pipelines.conftest import shared_data
from tests.pipelines.parsing.synthetic import write_treebank


def test_pairs_are_the_words_and_the_linearised_cleaned_tree(tmp_path):
    root = write_treebank(tmp_path, files=((3, 5), (150, 2)))
    pairs, gold = treebank_pairs(root, "train")
    assert len(pairs) == len(gold) == 5
    for (source, target), tree in zip(pairs, gold, strict=True):
        assert source.split() == tree.leaves()
        assert target.split().count("XX") == len(tree.leaves())
        assert "-NONE-" not in target and "NP-SBJ" not in target
    tagged, _ = treebank_pairs(root, "dev", pos_tags=True)
    assert len(tagged) == 2 and "XX" not in tagged[0][1] and "DT" in tagged[0][1].split()
    assert treebank_pairs(root, "test") == ([], [])  # a split without files is empty


def test_gold_outputs_score_100_with_no_repair_and_broken_ones_are_counted(tmp_path):
    root = write_treebank(tmp_path, files=((3, 20),))
    pairs, gold = treebank_pairs(root, "train")
    perfect = parse_scores([target for _, target in pairs], gold)
    assert perfect["f1"] == 100.0 and perfect["exact_match"] == 100.0
    assert perfect["repaired"] == 0 and perfect["repaired_percent"] == 0.0
    broken = [target for _, target in pairs]
    broken[0] = broken[0].rsplit(" ", 1)[0]  # the last closing bracket missing: repaired
    broken[1] = ")S " + broken[1]  # a stray closing bracket
    scores = parse_scores(broken, gold)
    assert scores["repaired"] == 2 and scores["repaired_percent"] == 10.0
    assert scores["f1"] == 100.0  # both repairs restore the gold tree
    with pytest.raises(ValueError, match="3 parses for 20 gold trees"):
        parse_scores(broken[:3], gold)


def test_parsed_lines_keep_the_input_words_at_the_leaves():
    trees, repaired = parse_lines(["(S (NP XX )NP (VP XX XX", ""], ["Dogs bark loudly", "Yes ."])
    assert [tree.leaves() for tree in trees] == [["Dogs", "bark", "loudly"], ["Yes", "."]]
    assert to_bracketed(trees[0]) == "(TOP (S (NP (XX Dogs)) (VP (XX bark) (XX loudly))))"
    assert repaired == 2


def test_target_tokens_of_the_sample_are_a_closed_vocabulary():
    root = shared_data("treebank")
    pairs, gold = treebank_pairs(root, "dev")
    assert len(pairs) == len(gold) == len(read_trees(root, "dev")) == 427
    tokens = target_tokens(pairs)
    assert "XX" in tokens and "(NP" in tokens and ")NP" in tokens and len(tokens) < 100
    # Targets that also write the words keep the same closed vocabulary.
    tagged, _ = treebank_pairs(root, "dev", pos_tags=True)
    with_words, _ = treebank_pairs(root, "dev", pos_tags=True, words=True)
    assert target_tokens(with_words, words=True) == target_tokens(tagged)
    assert len(with_words[0][1].split()) == len(tagged[0][1].split()) + len(tagged[0][0].split())
