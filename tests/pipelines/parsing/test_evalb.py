"""The EVALB-convention scorer on trees scored by hand."""

import pytest

from pipelines.parsing.evalb import brackets, read_bracketed, score_trees

GOLD = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"


def score(gold, test):
    return score_trees([read_bracketed(g) for g in gold], [read_bracketed(t) for t in test])


def test_identical_trees_score_100():
    result = score([GOLD], [GOLD])["all"]
    assert result == {"precision": 100.0, "recall": 100.0, "f1": 100.0, "exact_match": 100.0,
                      "sentences": 1}  # fmt: skip


def test_a_wrong_attachment_costs_the_brackets_it_moves():
    # Gold: NP 0-2, VP 2-3, S 0-3. Test: NP 0-1, VP 1-3, S 0-3. One of three matches.
    test = "(TOP (S (NP (DT The)) (VP (NN dog) (VBZ barks)) (. .)))"
    result = score([GOLD], [test])["all"]
    assert (result["precision"], result["recall"], result["f1"]) == (33.33, 33.33, 33.33)
    assert result["exact_match"] == 0.0


def test_punctuation_is_removed_and_brackets_left_empty_are_not_counted():
    gold = read_bracketed("(TOP (S (NP (NN It)) (VP (VBZ works)) (PRN (, ,)) (. .)))")
    # The comma and the period (positions 2, 3) go; PRN covers nothing; TOP is not counted.
    assert brackets(gold, {2, 3}) == {("NP", 0, 1): 1, ("VP", 1, 2): 1, ("S", 0, 2): 1}
    # A test tree that attaches the period elsewhere loses nothing.
    test = "(TOP (S (NP (NN It)) (VP (VBZ works) (PRN (, ,)) (. .))))"
    assert score([str(gold)], [test])["all"]["f1"] == 100.0


def test_repeated_brackets_count_as_a_multiset():
    gold = "(TOP (S (NP (NP (NNS dogs))) (VP (VBP bark))))"  # NP 0-1 twice
    test = "(TOP (S (NP (NNS dogs)) (VP (VBP bark))))"
    result = score([gold], [test])["all"]
    # 3 of 4 gold brackets found, all 3 test brackets right.
    assert (result["precision"], result["recall"], result["f1"]) == (100.0, 75.0, 85.71)
    assert score([test], [gold])["all"]["precision"] == 75.0


def test_function_tags_indices_and_advp_prt_are_one_label():
    gold = "(TOP (S (NP-SBJ-1 (PRP He)) (VP (VBD gave) (PRT (RP up)) (NP=2 (NN hope)))))"
    test = "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up)) (NP (NN hope)))))"
    assert score([gold], [test])["all"]["f1"] == 100.0
    wrong = "(TOP (S (NP (PRP He)) (VP (VBD gave) (PP (RB up)) (NP (NN hope)))))"
    assert score([gold], [wrong])["all"]["f1"] == 80.0  # 4 of 5 either way


def test_placeholder_tags_are_scored_by_the_gold_trees_punctuation():
    test = "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks)) (XX .)))"
    assert score([GOLD], [test])["all"]["f1"] == 100.0


def test_the_40_word_cut_counts_punctuation_but_not_empty_elements():
    def sentence(words, extra=""):
        leaves = " ".join(f"(NN w{i})" for i in range(words))
        return f"(TOP (S (NP {leaves}) {extra}(. .)))"

    forty = sentence(39)  # 39 words and a period: 40
    forty_one = sentence(40)  # 41
    with_trace = sentence(39, "(NP (-NONE- *)) ")  # 40; the trace is not counted
    wrong = "(TOP (S {} (. .)))"
    gold = [forty, forty_one, with_trace]
    test = [wrong.format(" ".join(f"(NN w{i})" for i in range(n))) for n in (39, 40, 39)]
    test[2] = wrong.format(" ".join(f"(NN w{i})" for i in range(39)) + " (-NONE- *)")
    result = score(gold, test)
    assert result["all"]["sentences"] == 3 and result["len<=40"]["sentences"] == 2
    # Each test tree finds S but not NP: precision 1/1, recall 1/2.
    assert result["len<=40"]["precision"] == 100.0 and result["len<=40"]["recall"] == 50.0


def test_trees_over_other_words_are_refused():
    with pytest.raises(ValueError, match="sentence 2: the test tree's words differ"):
        score([GOLD, GOLD], [GOLD, GOLD.replace("dog", "cat")])


def test_parseval_command_scores_files_and_the_baseline(tmp_path, capsys):
    import json

    from pipelines import cli

    gold = tmp_path / "gold.trees"
    gold.write_text(f"{GOLD}\n(TOP (S (NP (NNS dogs)) (VP (VBP bark))))\n")
    trees = tmp_path / "test.trees"
    trees.write_text(
        "(TOP (S (NP (DT The)) (VP (NN dog) (VBZ barks)) (. .)))\n"
        "(TOP (S (NP (NNS dogs)) (VP (VBP bark))))\n"
    )
    output = tmp_path / "scores.json"
    argv = ["parseval", "--trees", str(trees), "--gold", str(gold), "--output", str(output)]
    assert cli.main(argv) == 0
    # 1 + 3 matched of 3 + 3 brackets each side.
    assert json.loads(output.read_text())["all"]["f1"] == 66.67
    assert "all sentences: 2 sentences, labelled precision 66.67" in capsys.readouterr().out
    # Right-branching: S 0-3, S 1-3, S 2-3 (the period's S is empty) against NP 0-2, VP 2-3,
    # S 0-3; S 0-2, S 1-2 against NP 0-1, VP 1-2, S 0-2. 2 of 5 test and 6 gold brackets.
    assert cli.main(["parseval", "--right-branching", "--gold", str(gold)]) == 0
    assert "labelled precision 40.00, recall 33.33, F1 36.36" in capsys.readouterr().out

    trees.write_text("(TOP (S (NP (NNS dogs)))\n")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --trees {trees}, line 1: not a bracketed tree")
    trees.write_text("(TOP (S (NP (NNS dogs)) (VP (VBP bark))))\n")
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --trees {trees} has 1 trees but --gold {gold} has 2"
    )


def test_right_branching_scores_as_computed_by_hand():
    from pipelines.parsing.trees import right_branching

    gold = read_bracketed("(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks) (ADVP (RB loudly)))))")
    baseline = right_branching(gold.leaves())
    # Baseline S 0-4, S 1-4, S 2-4, S 3-4; gold NP 0-2, ADVP 3-4, VP 2-4, S 0-4: one match.
    result = score_trees([gold], [baseline])["all"]
    assert (result["precision"], result["recall"]) == (25.0, 25.0)
