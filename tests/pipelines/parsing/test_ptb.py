"""The `ptb` recipe end to end: train, export, `kt parse`, `kt parseval`."""

import collections
import json
import os

import keras
import pytest
import sentencepiece
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from pipelines.commands import export, parse, parseval, train
from pipelines.commands import translate as translate_command
from pipelines.data.tokenizer import load_tokenizer
from pipelines.errors import ExportError
from pipelines.evaluation import translate
from pipelines.parsing.corpus import (
    bracket_constraint,
    parse_lines,
    parse_scores,
    tags_path,
    target_tokens,
    treebank_pairs,
    vocabulary_tags,
)
from pipelines.parsing.evalb import read_bracketed, score_trees
from pipelines.parsing.trees import read_trees, to_bracketed
from pipelines.serving import client
from pipelines.training import recorded
from tests.pipelines.parsing.synthetic import write_treebank

# One worker runs the module, so its module fixtures are built once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("ptb")

TINY = [
    "--set", "model.num_layers=1", "--set", "model.hidden_dim=32",
    "--set", "model.intermediate_dim=64", "--set", "model.num_heads=2",
    "--set", "max_minutes=null", "--steps", "6", "--steps-per-epoch", "3",
    "--vocabulary-size", "120", "--batch-tokens", "1100", "--average-last", "1",
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
    argv = ["--run-dir", out, "--base", str(root / "saved"), "--name", "ptb"]
    # What kt parse and the tests below call.
    assert export.main([*argv, "--signatures", "serving_default", "nbest", "prefix"]) == 0
    return root, treebank, out


def test_heldout_split_validation_parses_dev_where_test_files_exist(tmp_path):
    treebank = write_treebank(tmp_path / "treebank", files=((1, 60), (142, 12), (173, 8)))
    out = str(tmp_path / "run")
    flags = ["--treebank-dir", treebank, "--output-dir", out, "--heldout-split", "validation"]
    assert train.main(["--recipe", "ptb", *flags, *TINY]) == 0
    with open(os.path.join(out, "result.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    assert result["greedy_parse"]["split"] == "dev" and result["heldout_split"] == "validation"
    gold = [read_bracketed(line) for line in open(os.path.join(out, "heldout.trees"))]
    assert gold == read_trees(treebank, "dev") != read_trees(treebank, "test")


def test_the_run_reports_parse_scores_on_dev_and_keeps_brackets_whole(ptb_run):
    _, treebank, out = ptb_run
    with open(os.path.join(out, "result.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    parsed = result["greedy_parse"]
    assert parsed["split"] == "dev" and "greedy_bleu" not in result
    gold = [read_bracketed(line) for line in open(os.path.join(out, "heldout.trees"))]
    assert gold == read_trees(treebank, "dev")
    # The run's figure is the greedy parse of dev scored against the gold trees.
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    tokenizer = load_tokenizer(os.path.join(out, "sentencepiece.model"))
    sentences = [" ".join(tree.leaves()) for tree in gold]
    spm_path = os.path.join(out, "sentencepiece.model")
    # The recipe's tree_constraint, copying the words its targets write.
    constraint = bracket_constraint(spm_path, model.eos_id, copy_words=True)
    greedy = translate(
        model, tokenizer, sentences, max_source_length=1100, extra_length=40, constraint=constraint
    )
    tags = vocabulary_tags(spm_path)
    assert parsed == {"split": "dev", **parse_scores(greedy, gold, tags, with_words=True)}
    assert parsed["repaired"] == 0  # constrained outputs are trees over the words
    for output, sentence in zip(greedy, sentences, strict=True):  # each word, then its tag
        written = [t for t in output.split() if not t.startswith(("(", ")"))]
        assert written[::2] == sentence.split() and set(written[1::2]) <= tags
    processor = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(out, "sentencepiece.model")
    )
    target = "(S (NP DT NN )NP (VP VBZ )VP . )S"  # the recipe keeps POS tags
    assert processor.encode(target, out_type=str) == ["▁" + t for t in target.split()]
    # The words its targets write are not kept whole: they are the source's pieces.
    words = {word for sentence in sentences for word in sentence.split()}
    assert len(words) > 10 and tags & words <= {".", ","}  # punctuation is its own tag


# How lengths count in an export that sets none (GNMT's penalty, each source's own limit).
LENGTHS = {"penalty_form": "gnmt", "max_output_length": 0, "end_at_limit": False,
           "batching": False}  # fmt: skip


def test_the_export_takes_the_recipes_search_and_output_limit(ptb_run, tmp_path, capsys):
    root, _, _ = ptb_run
    version = str(root / "saved" / "ptb" / "1")
    settings = client.export_settings(version)
    assert settings == {"beam_size": 3, "alpha": 0.3, "nbest": 3, "extra_length": 40,
                        "max_source_length": 1100, "tree_constraint": True,
                        "tree_words": True, "quantize": None, **LENGTHS,
                        "signatures": ["serving_default", "nbest", "prefix"]}  # fmt: skip
    loaded = tf.saved_model.load(version)
    outputs = loaded.signatures["nbest"](inputs=tf.constant(["the dog sees a cat ."]))
    assert outputs["translations"].shape == (1, 3)  # nbest: the recipe's beam of 3
    # kt translate checks prefixes against the export's own limit: source pieces + 1 + 40.
    source, prefixes = tmp_path / "source", tmp_path / "prefixes"
    source.write_text("the dog barks\n")
    pieces = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(version, "assets", "sentencepiece.model")
    )
    limit = len(pieces.encode("the dog barks")) + 1 + 40
    prefixes.write_text(" ".join(["(NP"] * (limit + 1)) + "\n")
    argv = ["--model", version, "--input", str(source), "--prefix-file", str(prefixes)]
    assert translate_command.main(argv) == 2
    assert f"more than the {limit} its sentence may produce" in capsys.readouterr().err
    prefixes.write_text(" ".join(["(NP"] * limit) + "\n")
    assert translate_command.main(argv) == 0
    assert capsys.readouterr().out.startswith("(NP (NP")


def test_exports_without_a_settings_file_searched_as_before(tmp_path):
    assert client.export_settings(str(tmp_path)) == {
        "beam_size": 4, "alpha": 0.6, "nbest": 4, "extra_length": 50, "tree_constraint": False,
        "tree_words": False, **LENGTHS,
    }  # fmt: skip
    (tmp_path / "assets.extra").mkdir()
    (tmp_path / "assets.extra" / "keras_transformer.json").write_text("[]")
    with pytest.raises(ExportError, match="not a JSON object"):
        client.export_settings(str(tmp_path))


def test_parse_writes_one_tree_a_line_over_the_input_words_and_parseval_scores_it(
    ptb_run, tmp_path, capsys
):
    root, treebank, _ = ptb_run
    gold = read_trees(treebank, "dev")
    sentences = [" ".join(tree.leaves()) for tree in gold]
    words = tmp_path / "dev.words"
    words.write_text("\n".join(sentences) + "\n")
    output = tmp_path / "dev.trees"
    model = str(root / "saved" / "ptb")
    argv = ["--model", model, "--input", str(words), "--output", str(output), "--batch-size", "5"]
    assert parse.main(argv) == 0
    lines = output.read_text().splitlines()
    assert len(lines) == len(sentences) and not os.path.exists(f"{output}.partial")
    # The same as the export's own outputs turned into trees, in input order.
    version = os.path.join(model, "1")
    raw = tf.saved_model.load(version).signatures["serving_default"](inputs=tf.constant(sentences))
    tags = vocabulary_tags(os.path.join(version, "assets", "sentencepiece.model"))
    assert "DT" in tags and "NN" in tags and not any(t.startswith(("(", ")")) for t in tags)
    expected, repaired = parse_lines(
        [t.decode() for t in raw["translations"].numpy()], sentences, tags, with_words=True
    )
    assert lines == [to_bracketed(tree) for tree in expected]
    assert repaired == 0  # the export searches under the recipe's tree constraint
    for line, sentence in zip(lines, sentences, strict=True):
        tree = read_bracketed(line)
        assert tree.label() == "TOP" and tree.leaves() == sentence.split()
    share = 100.0 * repaired / len(sentences)
    assert (
        f"{repaired} of {len(sentences)} outputs ({share:.2f}%) were repaired"
        in capsys.readouterr().err
    )
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
    assert json.loads(scores.read_text()) == score_trees(gold, expected)


def test_parse_reads_brackets_in_words_as_the_treebank_writes_them(ptb_run, tmp_path, capsys):
    root, _, _ = ptb_run
    words, output = tmp_path / "in.words", tmp_path / "out.trees"
    words.write_text("the dog ( sees ) a (cat) .\n")
    argv = ["--model", str(root / "saved" / "ptb"), "--input", str(words), "--output", str(output)]
    assert parse.main(argv) == 0
    tree = read_bracketed(output.read_text())
    assert tree.leaves() == "the dog -LRB- sees -RRB- a -LRB-cat-RRB- .".split()
    assert "0 of 1 outputs (0.00%) were repaired" in capsys.readouterr().err


def test_the_export_writes_words_as_its_run_says_or_as_told(ptb_run, tmp_path):
    _, _, out = ptb_run
    argv = ["--run-dir", out, "--base", str(tmp_path), "--name", "p", "--beam-size", "1"]
    assert export.main([*argv, "--no-tree-words", "--signatures", "serving_default"]) == 0
    assert client.export_settings(str(tmp_path / "p" / "1"))["tree_words"] is False
    config = json.loads(open(os.path.join(out, "config.json")).read())
    assert recorded.run_tree_words(out) is config["data"]["treebank_words"] is True
    config["data"]["corpus"] = "files"  # only a parser's targets write words
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(config))
    assert recorded.run_tree_words(str(other)) is False
    assert recorded.run_tree_words(str(tmp_path / "none")) is False


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


def test_whole_source_words_keep_the_parsers_tags_apart_from_the_words(tmp_path, capsys):
    treebank = write_treebank(tmp_path / "treebank")
    out, base = str(tmp_path / "run"), str(tmp_path / "saved")
    steps = ["--steps", "2", "--steps-per-epoch", "2", "--beam-size", "1"]
    argv = ["--recipe", "ptb", "--treebank-dir", treebank, "--output-dir", out, *TINY, *steps]
    assert train.main([*argv, "--set", "batching.whole_source_words=6"]) == 0
    spm_path = os.path.join(out, "sentencepiece.model")
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    sentences = [" ".join(tree.leaves()) for tree in read_trees(treebank, "train")]
    counts = collections.Counter(word for sentence in sentences for word in sentence.split())
    frequent = [word for word, _ in counts.most_common(6)]
    assert all(processor.encode(word, out_type=str) == ["▁" + word] for word in frequent)
    # The pieces kept whole are the trees' tokens and those words, no others.
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(open(spm_path, "rb").read())
    defined = proto.SentencePiece.USER_DEFINED
    kept = {piece.piece[1:] for piece in proto.pieces if piece.type == defined}
    pairs, _ = treebank_pairs(treebank, "train", pos_tags=True, words=True)
    assert kept == set(target_tokens(pairs, words=True)) | set(frequent)
    assert len(kept) < len(set(target_tokens(pairs, words=True)) | set(counts))
    # The tags are the trees' own, listed beside the vocabulary: not the words kept whole.
    tags = {"DT", "NN", "VBZ", "IN", "."}
    assert open(tags_path(spm_path)).read().split() == sorted(tags)
    assert vocabulary_tags(spm_path) == tags and "." in frequent  # "." is both
    with open(os.path.join(out, "result.json"), encoding="utf-8") as handle:
        assert json.load(handle)["greedy_parse"]["repaired"] == 0
    argv = ["--run-dir", out, "--base", base, "--name", "ptb", "--signatures", "serving_default"]
    assert export.main(argv) == 0
    assets = os.path.join(base, "ptb", "1", "assets")
    assert vocabulary_tags(os.path.join(assets, "sentencepiece.model")) == tags
    words, output = tmp_path / "in.words", tmp_path / "out.trees"
    words.write_text("the dog sees a cat .\n")
    argv = ["--model", os.path.join(base, "ptb"), "--input", str(words), "--output", str(output)]
    assert parse.main(argv) == 0
    tree = read_bracketed(output.read_text())
    assert tree.leaves() == "the dog sees a cat .".split()
    assert {tag for _, tag in tree.pos()} <= tags
    assert "0 of 1 outputs (0.00%) were repaired" in capsys.readouterr().err


def test_source_words_and_tree_tokens_that_fill_the_vocabulary_are_refused(tmp_path, capsys):
    treebank = write_treebank(tmp_path / "treebank")
    out = tmp_path / "run"
    argv = ["--recipe", "ptb", "--treebank-dir", treebank, "--output-dir", str(out), *TINY]
    # 13 brackets and tags and 18 other words: more than three quarters of 40 pieces.
    settings = ["--vocabulary-size", "40", "--set", "batching.whole_source_words=30"]
    assert train.main([*argv, *settings]) == 2
    error = capsys.readouterr().err
    assert "whole_source_words: 31 tokens kept whole, too many for vocabulary_size 40" in error
    assert not (out / "sentencepiece.model").exists() and not (out / "sentencepiece.tags").exists()
    assert not (out / "checkpoints").exists()
