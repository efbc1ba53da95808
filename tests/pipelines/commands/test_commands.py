"""The translate, evaluate, attention and demo commands."""

import json
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest
import sacrebleu
import sentencepiece as spm

from pipelines import visualization
from pipelines.commands import attention, evaluate
from tests.pipelines.conftest import tiny_translation_model

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
TINY = [
    "--set", "default_corpus_sizes=[1500,40,40]",
    "--set", "model.num_layers=1",
    "--set", "model.hidden_dim=32",
    "--set", "model.intermediate_dim=64",
    "--set", "batch_tokens=512",
    "--set", "vocabulary_size=200",
    "--set", "steps=30",
    "--set", "steps_per_epoch=15",
]  # fmt: skip


def test_evaluate_matches_sacrebleu_and_writes_json(tmp_path, capsys):
    hypotheses = ["Montag, 3. März 2014", "16:08", "12,5 %"]
    references = ["Montag, 3. März 2014", "16:08 Uhr", "12,5 %"]
    (tmp_path / "hyp").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(references) + "\n", encoding="utf-8")
    output = tmp_path / "scores.json"
    argv = ["--hypotheses", str(tmp_path / "hyp"), "--references", str(tmp_path / "ref")]
    assert evaluate.main(argv + ["--output", str(output)]) == 0
    scores = json.loads(output.read_text())
    expected_bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    expected_chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    assert scores["bleu"] == pytest.approx(expected_bleu, abs=0.01) and scores["bleu"] < 100
    assert scores["chrf"] == pytest.approx(expected_chrf, abs=0.01)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed")
    assert scores["chrf_signature"].startswith("nrefs:1|case:mixed")
    printed = capsys.readouterr().out
    assert f"BLEU {scores['bleu']:.2f}" in printed and scores["chrf_signature"] in printed

    (tmp_path / "short").write_text("one line\n", encoding="utf-8")
    argv = ["--hypotheses", str(tmp_path / "short"), "--references", str(tmp_path / "ref")]
    assert evaluate.main(argv) == 2
    assert "has 1 lines but" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    model, spm_path = tiny_translation_model(
        root, 120, seed=1, num_layers=2, hidden_dim=16, intermediate_dim=32, num_heads=2
    )
    model.save(root / "model.keras")
    return root, model, spm.SentencePieceProcessor(model_file=spm_path)


def test_attention_maps_are_probabilities_over_the_labelled_pieces(tiny_run):
    _, model, processor = tiny_run
    maps, source, target = visualization.attention_maps(
        model, processor, "March 3, 2014", "3. März 2014"
    )
    assert maps.shape == (2, 2, len(target), len(source))
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, rtol=1e-5)
    assert source[-1] == target[-1] == "</s>"
    assert "".join(source[:-1]).replace("\u2581", " ").strip() == "March 3, 2014"


@pytest.mark.parametrize(
    "flags, rows, cols",
    [([], 2, 2), (["--head", "mean"], 2, 1), (["--layer", "1", "--head", "0"], 1, 1)],
)
def test_attention_png_has_one_panel_per_layer_and_head(tiny_run, tmp_path, flags, rows, cols):
    root, model, processor = tiny_run
    png = tmp_path / "attention.png"
    source, target = "Monday, March 3, 2014", "Montag, 3. März 2014"
    argv = ["--run-dir", str(root), "--source", source, "--target", target, "--output", str(png)]
    assert attention.main(argv + flags) == 0
    height, width = matplotlib.image.imread(png).shape[:2]
    source_length = len(processor.encode(source)) + 1
    target_length = len(processor.encode(target)) + 1
    assert (width, height) == visualization.figure_size(rows, cols, target_length, source_length)


def test_attention_rejects_a_missing_layer(tiny_run, tmp_path, capsys):
    root = tiny_run[0]
    argv = ["--run-dir", str(root), "--source", "5 kg", "--layer", "7"]
    assert attention.main(argv + ["--output", str(tmp_path / "a.png")]) == 2
    assert "--layer 7 out of range: the model has 2" in capsys.readouterr().err


def test_demo_trains_exports_translates_and_scores(tmp_path):
    """The `make demo` path, shortened: a few steps on a tiny model."""
    run, base = tmp_path / "run", tmp_path / "saved_models"
    command = [sys.executable, "-m", "pipelines", "demo", "--output-dir", str(run),
               "--base", str(base), "--examples", "2", *TINY]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (base / "default" / "1" / "saved_model.pb").is_file()
    assert (base / "default" / "1" / "assets" / "sentencepiece.model").is_file()
    sources = (run / "heldout.source").read_text(encoding="utf-8").splitlines()
    translations = (run / "heldout.translation").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(translations) == 40
    scores = json.loads((run / "heldout.scores.json").read_text())
    assert scores["sentences"] == 40 and 0.0 <= scores["bleu"] <= 100.0
    assert f"Held-out BLEU {scores['bleu']:.2f}" in result.stdout
    assert result.stdout.count("(reference: ") == 2


def test_kt_lists_every_command_and_each_parses_its_help(capsys):
    """`kt --help` names every subcommand; `kt COMMAND --help` reaches its parser."""
    import ast
    import pathlib

    from pipelines import cli

    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"  {name} " in listed
        with pytest.raises(SystemExit) as exit_info:
            cli.main([name, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: kt {name}" in capsys.readouterr().out
    setup = pathlib.Path(__file__).resolve().parents[3] / "setup.py"
    scripts = [
        node.value
        for node in ast.walk(ast.parse(setup.read_text()))
        if isinstance(node, ast.Constant) and "=pipelines." in str(node.value)
    ]
    assert scripts == ["kt=pipelines.cli:main"]
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_python_m_pipelines_prints_one_error_line_and_no_tensorflow_logs(tmp_path):
    """The process as a user starts it: TensorFlow's start-up lines stay off stderr."""
    command = [sys.executable, "-m", "pipelines", "export", "--run-dir", str(tmp_path)]
    env = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2
    expected = f"error: model not found: {tmp_path}/model.keras (give --run-dir or"
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(expected)


def test_commands_that_score_text_never_import_tensorflow():
    """`kt evaluate` and `kt parseval` start without TensorFlow's seconds of import."""
    import subprocess
    import sys

    from pipelines.cli import COMMANDS, WITHOUT_TENSORFLOW

    modules = ", ".join(COMMANDS[name] for name in sorted(WITHOUT_TENSORFLOW))
    code = f"import sys, {modules}; print(sorted({{'tensorflow', 'keras'}} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
