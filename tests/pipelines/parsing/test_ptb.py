"""The `ptb` recipe end to end: train, export, `kt parse`, `kt parseval`."""

import json
import os

import pytest
import tensorflow as tf

from pipelines.commands import export, parse, parseval, train
from pipelines.parsing.evalb import read_bracketed
from pipelines.parsing.trees import read_trees
from tests.pipelines.parsing.synthetic import write_treebank

TINY = [
    "--set", "model.num_layers=1", "--set", "model.hidden_dim=32",
    "--set", "model.intermediate_dim=64", "--set", "model.num_heads=2",
    "--set", "max_minutes=null", "--steps", "6", "--steps-per-epoch", "3",
    "--vocabulary-size", "120", "--batch-tokens", "700", "--average-last", "1",
    "--beam-size", "3", "--extra-length", "40",
]  # fmt: skip


@pytest.fixture(scope="module")
def ptb_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ptb")
    treebank = write_treebank(root / "treebank")
    out = str(root / "run")
    assert (
        train.main(["--recipe", "ptb", "--treebank-dir", treebank, "--output-dir", out, *TINY]) == 0
    )
    assert export.main(["--run-dir", out, "--base", str(root / "saved"), "--name", "ptb"]) == 0
    return root, treebank, out


def test_the_run_reports_parse_scores_on_dev_and_keeps_brackets_whole(ptb_run):
    _, treebank, out = ptb_run
    with open(os.path.join(out, "result.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    parsed = result["greedy_parse"]
    assert parsed["split"] == "dev" and "greedy_bleu" not in result
    assert 0 <= parsed["f1"] <= 100 and 0 <= parsed["repaired"] <= 12
    gold = [read_bracketed(line) for line in open(os.path.join(out, "heldout.trees"))]
    assert gold == read_trees(treebank, "dev")
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(out, "sentencepiece.model")
    )
    target = "(S (NP DT NN )NP (VP VBZ )VP . )S"  # the recipe keeps POS tags
    assert processor.encode(target, out_type=str) == ["▁" + t for t in target.split()]


def test_the_export_takes_the_recipes_search_and_output_limit(ptb_run):
    root, _, _ = ptb_run
    loaded = tf.saved_model.load(str(root / "saved" / "ptb" / "1"))
    assert int(loaded.extra_length.numpy()) == 40
    outputs = loaded.signatures["nbest"](inputs=tf.constant(["the dog sees a cat ."]))
    assert outputs["translations"].shape == (1, 3)  # nbest: the recipe's beam of 3


def test_parse_writes_one_tree_a_line_over_the_input_words_and_parseval_scores_it(
    ptb_run, tmp_path, capsys
):
    root, treebank, _ = ptb_run
    sentences = [" ".join(tree.leaves()) for tree in read_trees(treebank, "dev")]
    words = tmp_path / "dev.words"
    words.write_text("\n".join(sentences) + "\n")
    output = tmp_path / "dev.trees"
    model = str(root / "saved" / "ptb")
    argv = ["--model", model, "--input", str(words), "--output", str(output), "--batch-size", "5"]
    assert parse.main(argv) == 0
    assert "were repaired into trees" in capsys.readouterr().err
    lines = output.read_text().splitlines()
    assert len(lines) == len(sentences)
    for line, sentence in zip(lines, sentences, strict=True):
        tree = read_bracketed(line)
        assert tree.label() == "TOP" and tree.leaves() == sentence.split()
    assert not os.path.exists(f"{output}.partial")
    scores = tmp_path / "scores.json"
    argv = [
        "--trees",
        str(output),
        "--treebank",
        treebank,
        "--split",
        "dev",
        "--output",
        str(scores),
    ]
    assert parseval.main(argv) == 0
    assert 0 <= json.loads(scores.read_text())["all"]["f1"] <= 100


def test_parse_refuses_bad_arguments_before_loading_the_model(tmp_path, capsys):
    missing = str(tmp_path / "missing.words")
    assert parse.main(["--model", str(tmp_path), "--input", missing]) == 2
    assert f"--input: file not found: {missing}" in capsys.readouterr().err
    words = tmp_path / "in.words"
    words.write_text("a b\n")
    argv = ["--model", str(tmp_path), "--input", str(words), "--batch-size", "0"]
    assert parse.main(argv) == 2
    assert "--batch-size must be positive. Received: 0" in capsys.readouterr().err


def test_the_recipe_needs_its_treebank(tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    assert train.main(["--recipe", "ptb", *out]) == 2
    assert "corpus 'ptb' needs treebank_dir" in capsys.readouterr().err
    missing = str(tmp_path / "none")
    assert train.main(["--recipe", "ptb", "--treebank-dir", missing, *out]) == 2
    assert f"treebank folder not found: {missing}" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert train.main(["--recipe", "ptb", "--treebank-dir", str(empty), *out]) == 2
    assert "no wsj_NNNN.mrg files of the train split" in capsys.readouterr().err
