"""`kt train --init-from`: a run started from a trained one; and a rerun's settings checked."""

import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest
import sentencepiece as spm

from pipelines.commands.train import main
from pipelines.data.default_corpus import default_corpus
from pipelines.data.vocabulary_extension import spellings
from pipelines.training.heldout import heldout_scores
from pipelines.training.identity import RESUMABLE, differing_settings
from pipelines.training.init_from import apply_source, source_arguments
from pipelines.training.loading import load_config
from pipelines.training.run import build_model
from tests.pipelines.training.shared import TINY
from tests.test_case import killed_and_resumed

# One worker runs the module, so its module fixtures are built once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("init_from")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def refused(capsys, *argv):
    """The one `error:` line `kt train argv` ends with (status 2)."""
    try:
        status = main(list(argv))
    except SystemExit as exit_info:  # argparse's own errors
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def printed_config(capsys, *argv):
    assert main([*argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished tiny run on the default corpus: the model runs start from."""
    out = tmp_path_factory.mktemp("source") / "run"
    flags = ["--steps", "4", "--steps-per-epoch", "2", "--set", "heldout_split=none", *TINY]
    assert main(["--output-dir", str(out), *flags]) == 0
    return out


@pytest.fixture(scope="module")
def untied_source(tmp_path_factory):
    """As `source`, with an output projection `(D, V)` of its own and an output bias."""
    out = tmp_path_factory.mktemp("untied") / "run"
    flags = ["--steps", "4", "--steps-per-epoch", "2", "--set", "heldout_split=none", *TINY,
             "--no-tie-output-embeddings", "--output-bias"]  # fmt: skip
    assert main(["--output-dir", str(out), *flags]) == 0
    return out


def files_bytes(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_rerun_with_other_architecture_or_data_is_refused_and_loses_nothing(source, capsys):
    before = files_bytes(source)
    err = refused(
        capsys, "--output-dir", str(source), *TINY, "--set", "model.hidden_dim=64",
        "--target-locale", "fr",
    )  # fmt: skip
    assert "model.hidden_dim 32 -> 64" in err and 'data.target_locale "de" -> "fr"' in err
    assert f"--init-from {source}" in err and "new --output-dir" in err
    assert files_bytes(source) == before


def test_a_rerun_may_change_only_the_resumable_settings(source):
    recorded = json.loads((source / "config.json").read_text())
    changed = {"steps": 99, "max_minutes": 5, "average_last": 2, "beam_size": 1,
               "penalty_form": "power", "max_output_length": 20, "end_at_limit": True}  # fmt: skip
    assert set(changed) <= set(RESUMABLE)
    config = load_config("default", str(source / "config.json"), changed)
    assert differing_settings(recorded, config) == []
    # The recorded paths are compared as absolute paths; a setting a run's
    # config.json lacks (an older run's) counts as its default.
    del recorded["batching"]["shuffle_buffer"]
    recorded["data"]["multi30k_dir"] = os.path.relpath(source)
    config.data.multi30k_dir = str(source)
    assert differing_settings(recorded, config) == []
    config.batching.shuffle_buffer = 7
    assert differing_settings(recorded, config) == [("batching.shuffle_buffer", 100_000, 7)]
    config.batching.shuffle_buffer = 100_000
    # target_vocabulary, which --init-from sets from the source's files: an older run that
    # did not record it is not refused for it (its data check compares it with the folder).
    config.batching.target_vocabulary = True
    del recorded["batching"]["target_vocabulary"]
    assert differing_settings(recorded, config) == []
    recorded["batching"]["target_vocabulary"] = False
    assert differing_settings(recorded, config) == [("batching.target_vocabulary", False, True)]


def test_the_architecture_comes_from_the_source(source, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run"), "--init-from", str(source)]
    config = printed_config(capsys, *out, "--dropout", "0.3")
    stored = source_arguments(str(source / "model.keras"))
    for name in ("num_layers", "hidden_dim", "intermediate_dim", "num_heads", "normalize_first"):
        assert config["model"][name] == stored[name]
    assert config["model"]["preset"] is None and config["model"]["dropout"] == 0.3
    assert config["batching"]["vocabulary_size"] == stored["vocabulary_size"] == 200
    # The fine-tuning recipe's schedule, unless another recipe is named.
    assert config["optimization"]["warmup_steps"] == 200
    assert config["optimization"]["learning_rate_scale"] == 0.1
    assert printed_config(capsys, *out, "--recipe", "default")["optimization"]["steps"] == 1600
    err = refused(capsys, *out, "--hidden-dim", "64", "--vocabulary-size", "300")
    assert "model.hidden_dim=64 where it has 32" in err
    assert "batching.vocabulary_size=300 where it has 200" in err
    err = refused(capsys, *out, "--preset", "transformer_base")
    assert "model.num_layers=6 where it has 1" in err


def test_a_run_keeps_the_source_runs_data_and_search_settings_unless_given(
    source, tmp_path, capsys
):
    run = tmp_path / "source"  # the source run, as if trained with other settings
    run.mkdir()
    for name in ("model.keras", "sentencepiece.model"):
        shutil.copyfile(source / name, run / name)
    recorded = json.loads((source / "config.json").read_text())
    recorded["batching"].update(max_length=60, batch_tokens=700, subword_sampling=0.1)
    recorded["decoding"].update(alpha=0.3, beam_size=2)
    (run / "config.json").write_text(json.dumps(recorded))
    out = ["--output-dir", str(tmp_path / "run"), "--init-from", str(run)]
    config = printed_config(capsys, *out, "--batch-tokens", "900")
    batching, decoding = config["batching"], config["decoding"]
    assert batching["max_length"] == 60 and batching["subword_sampling"] == 0.1
    assert batching["batch_tokens"] == 900  # given: the run's own
    assert decoding["alpha"] == 0.3 and decoding["beam_size"] == 2
    # A named recipe's batching gives way to the source's too (only given settings win).
    assert printed_config(capsys, *out, "--recipe", "default")["batching"]["batch_tokens"] == 700
    # A .keras file outside a run folder records no settings: the recipe's.
    (tmp_path / "alone").mkdir()
    for name in ("model.keras", "sentencepiece.model"):
        shutil.copyfile(source / name, tmp_path / "alone" / name)
    alone = ["--output-dir", str(tmp_path / "run"), "--init-from", str(tmp_path / "alone")]
    assert printed_config(capsys, *alone)["batching"]["max_length"] == 128
    # A recorded value out of range is refused, naming the file and the setting.
    recorded["batching"]["max_length"] = 1
    (run / "config.json").write_text(json.dumps(recorded))
    err = refused(capsys, *out)
    assert str(run / "config.json") in err and "max_length" in err


def test_a_source_that_cannot_be_used_is_refused(source, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    assert "neither a run folder nor a .keras file" in refused(
        capsys, *out, "--init-from", str(tmp_path / "missing")
    )
    (tmp_path / "empty").mkdir()
    assert "holds no model.keras" in refused(capsys, *out, "--init-from", str(tmp_path / "empty"))
    checkpoint = sorted((source / "checkpoints").iterdir())[-1]
    lone = tmp_path / "lone.keras"
    lone.write_bytes(checkpoint.read_bytes())
    assert "no sentencepiece.model beside" in refused(capsys, *out, "--init-from", str(lone))
    (tmp_path / "sentencepiece.model").write_bytes(b"not a model")
    assert "is not a SentencePiece model" in refused(capsys, *out, "--init-from", str(lone))
    err = refused(capsys, "--output-dir", str(source), "--init-from", str(source))
    assert "is this run's own output_dir" in err
    assert not (tmp_path / "run").exists()


def test_a_run_starts_from_the_source_weights_and_vocabulary(source, tmp_path, capsys):
    out = tmp_path / "run"
    # A checkpoint finds the vocabulary in the run folder above it.
    checkpoint = str(sorted((source / "checkpoints").iterdir())[-1])
    flags = ["--output-dir", str(out), "--init-from", checkpoint, "--target-locale", "de_CH"]
    flags += ["--set", "default_corpus_sizes=[300,20,20]", "--steps", "2", "--batch-tokens", "512"]
    assert main(flags) == 0
    capsys.readouterr()
    vocabulary = (source / "sentencepiece.model").read_bytes()
    assert (out / "sentencepiece.model").read_bytes() == vocabulary
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 2 and result["resumed_at_step"] == 0
    # The model the first step updates holds the source's weights.
    config = load_config("default", str(out / "config.json"))
    apply_source(config, set())
    keras.utils.set_random_seed(config.optimization.seed)
    model, _, _ = build_model(config, str(out / "sentencepiece.model"))
    expected = keras.saving.load_model(checkpoint)
    assert len(model.weights) == len(expected.weights)
    for ours, theirs in zip(model.weights, expected.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    # ... which two steps changed.
    trained = keras.saving.load_model(out / "model.keras")
    assert any(
        not np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(trained.weights, expected.weights, strict=True)
    )


@pytest.mark.parametrize("kind", ["source", "untied_source"])
def test_an_extended_vocabulary_keeps_every_old_row_and_spells_the_new_ones(
    kind, request, tmp_path
):
    """`extend_vocabulary`: the source's pieces and rows first, bit for bit; each new piece's
    row the mean of the source's rows for its old spelling; the run trains on the grown model.
    An untied projection `(D, V)` grows along its last axis."""
    source = request.getfixturevalue(kind)
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--init-from", str(source), "--target-locale", "de_CH",
             "--set", "extend_vocabulary=150", "--set", "default_corpus_sizes=[300,20,20]",
             "--steps", "2", "--batch-tokens", "512"]  # fmt: skip
    assert main(flags) == 0
    old = spm.SentencePieceProcessor(model_file=str(source / "sentencepiece.model"))
    grown = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
    size, added = old.get_piece_size(), grown.get_piece_size() - old.get_piece_size()
    assert added > 0 and grown.piece_to_id("'") >= size  # the Swiss apostrophe, now a piece
    assert [grown.id_to_piece(i) for i in range(size)] == [old.id_to_piece(i) for i in range(size)]
    trained = keras.saving.load_model(out / "model.keras")
    assert trained.vocabulary_size == size + added
    # The model before its first step: the source's rows, then the new pieces' means.
    config = load_config("default", str(out / "config.json"))
    apply_source(config, set())
    model, _, _ = build_model(config, str(out / "sentencepiece.model"))
    original = keras.saving.load_model(source / "model.keras")
    rows = spellings(str(source / "sentencepiece.model"),
                     [grown.id_to_piece(i) for i in range(size, size + added)])  # fmt: skip
    grew = []
    for ours, theirs in zip(model.weights, original.weights, strict=True):
        ours, theirs = ours.numpy(), theirs.numpy()
        if ours.shape == theirs.shape:
            np.testing.assert_array_equal(ours, theirs)
            continue
        axis = [a != b for a, b in zip(ours.shape, theirs.shape, strict=True)].index(True)
        grew.append(ours.shape)
        old_rows = np.take(ours, np.arange(size), axis=axis)
        np.testing.assert_array_equal(old_rows, theirs)  # bitwise: every old row
        expected = np.stack([np.take(theirs, ids, axis=axis).mean(axis=axis) for ids in rows], axis)
        new_rows = np.take(ours, np.arange(size, size + added), axis=axis)
        np.testing.assert_allclose(new_rows, expected, rtol=1e-6, atol=1e-7)
    hidden = model.hidden_dim
    if kind == "source":  # the shared embedding
        assert grew == [(size + added, hidden)]
    else:  # the embedding, the projection (D, V) and its bias (V,)
        assert sorted(grew) == sorted([(size + added, hidden), (hidden, size + added),
                                       (size + added,)])  # fmt: skip


def test_extend_vocabulary_needs_a_joint_translation_source(source, tmp_path, capsys):
    err = refused(capsys, "--output-dir", str(tmp_path / "a"), *TINY,
                  "--set", "extend_vocabulary=100")  # fmt: skip
    assert "extend_vocabulary grows a source's vocabulary: it needs init_from" in err
    sided = tmp_path / "sided"
    shutil.copytree(source, sided)
    shutil.copy(sided / "sentencepiece.model", sided / "sentencepiece.target.model")
    err = refused(capsys, "--output-dir", str(tmp_path / "b"), "--init-from", str(sided),
                  "--set", "extend_vocabulary=100")  # fmt: skip
    assert "comes with a vocabulary a side; only a joint BPE translation vocabulary grows" in err
    assert not (tmp_path / "b").exists()
    # More pieces than the new data holds: one line naming the setting, no vocabulary written.
    err = refused(capsys, "--output-dir", str(tmp_path / "c"), "--init-from", str(source),
                  "--set", "default_corpus_sizes=[300,20,20]",
                  "--set", "extend_vocabulary=100000")  # fmt: skip
    assert "extend_vocabulary=100000: " in err and "Vocabulary size too high" in err
    assert not (tmp_path / "c" / "sentencepiece.model").exists()


@pytest.mark.slow
def test_a_killed_fine_tuning_run_resumes_from_its_own_backup(source, tmp_path):
    out = tmp_path / "run"
    steps = ["--steps", "300", "--steps-per-epoch", "300", "--backup-every", "5"]
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out),
               "--init-from", str(source), "--batch-tokens", "512", *steps,
               "--set", "default_corpus_sizes=[1500,40,40]"]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    second = killed_and_resumed(command, ROOT, env, out / "backup", out / "result.json")
    assert second.returncode == 0, second.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert 0 < result["resumed_at_step"] < 300 and result["steps"] == 300


@pytest.mark.slow
def test_fine_tuning_on_a_shifted_domain_improves_its_heldout_bleu(tmp_path, capsys):
    """A model of German renderings, fine-tuned on Swiss German ones (1'234.5 for 1.234,5)."""
    sizes = ["--set", "default_corpus_sizes=[1500,40,200]", "--set", "heldout_split=test"]
    source = tmp_path / "de"
    assert main(["--output-dir", str(source), *TINY, *sizes, "--steps", "600"]) == 0
    tuned = tmp_path / "de_CH"
    flags = ["--output-dir", str(tuned), "--init-from", str(source), "--batch-tokens", "512"]
    assert main([*flags, *sizes, "--target-locale", "de_CH", "--steps", "300"]) == 0
    capsys.readouterr()
    config = load_config("default", str(tuned / "config.json"))
    test = default_corpus([1500, 40, 200], "de_CH", config.optimization.seed)["test"]
    model = keras.saving.load_model(source / "model.keras")
    before = heldout_scores(config, str(source), model, test, "test")["greedy_bleu"]
    after = json.loads((tuned / "result.json").read_text())["greedy_bleu"]
    assert after > before + 5, (before, after)
