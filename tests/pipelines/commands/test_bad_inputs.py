"""Every command refuses bad input with one `error:` line, exit status 2, before any work.

Each case says what the command is given, what its one error line must say,
and what must be on disk afterwards. Work is made impossible (`no_work`), so
a check that came after the work would fail the case, not pass it late.
"""

import os
import pathlib

import numpy as np
import pytest

from pipelines import cli
from pipelines.files import STAGING, output_lock, remove_stale_staging
from pipelines.serving import client
from pipelines.training import checkpoints, run

GOOD = b"PK\x03\x04 a file that is already there\n"


@pytest.fixture
def no_work(monkeypatch):
    """Makes loading a model or starting a run fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command started its work before checking its input")

    monkeypatch.setattr(checkpoints, "load_checkpoint", refuse)
    monkeypatch.setattr(checkpoints.keras.saving, "load_model", refuse)
    monkeypatch.setattr(client.tf.saved_model, "load", refuse)
    monkeypatch.setattr(run, "run_training", refuse)


@pytest.fixture(scope="module")
def sentencepiece_bytes(tmp_path_factory):
    """A small SentencePiece model's bytes, trained once for the module."""
    from pipelines.data.default_corpus import generate_pairs
    from pipelines.data.tokenizer import train_sentencepiece

    path = tmp_path_factory.mktemp("spm") / "sentencepiece.model"
    pairs = generate_pairs(200, seed=0)
    train_sentencepiece([text for pair in pairs for text in pair], str(path), 100)
    return path.read_bytes()


@pytest.fixture
def files(tmp_path, sentencepiece_bytes):
    """A folder of inputs: text, a run folder, a file standing where a folder must be."""
    (tmp_path / "in.en").write_text("a\nb\n")
    (tmp_path / "ref.de").write_text("x\ny\n")
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "kept.keras").write_bytes(GOOD)
    (tmp_path / "broken.keras").write_bytes(b"\x00" * 943)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "model.keras").write_bytes(GOOD)
    (run_dir / "sentencepiece.model").write_bytes(sentencepiece_bytes)
    (tmp_path / "empty.txt").write_text("")
    models = tmp_path / "models" / "m"
    (models / "1").mkdir(parents=True)
    (models / "1" / "saved_model.pb").write_bytes(b"pb")
    (models / "2").mkdir()  # the newest version is empty
    (tmp_path / "ct2").mkdir()
    return tmp_path


# (name, argv with {t} for the folder, the error says, files that must not exist)
CASES = [
    ("translate: input missing",
     "translate --model {t}/models/m --input {t}/none.en", "--input: file not found", []),
    ("translate: output folder cannot be created",
     "translate --model {t}/models/m --input {t}/in.en --output {t}/a_file/out.de",
     "--output: cannot create the folder", []),
    ("translate: model folder missing",
     "translate --model {t}/nothing --input {t}/in.en", "--model: no such folder", []),
    ("translate: newest version broken",
     "translate --model {t}/models/m --input {t}/in.en --output {t}/out.de",
     "models/m/2 is broken: it has no saved_model.pb; an older version: --model", ["out.de"]),
    ("translate: beam size",
     "translate --model {t}/models/m --beam-size 0", "--beam-size must be positive", []),
    ("average: output folder cannot be created",
     "average {t}/kept.keras --output {t}/a_file/avg.keras", "--output: cannot create", []),
    ("average: output not .keras",
     "average {t}/kept.keras --output {t}/avg.h5", "--output must be a .keras file", ["avg.h5"]),
    ("average: checkpoint missing",
     "average {t}/kept.keras {t}/none.keras --output {t}/avg.keras",
     "checkpoint: file not found", ["avg.keras"]),
    ("evaluate: hypotheses missing",
     "evaluate --hypotheses {t}/none --references {t}/ref.de", "--hypotheses: file not found", []),
    ("evaluate: output folder cannot be created",
     "evaluate --hypotheses {t}/in.en --references {t}/ref.de --output {t}/a_file/s.json",
     "--output: cannot create", []),
    ("attention: output folder cannot be created",
     "attention --run-dir {t}/run --source a --output {t}/a_file/a.png",
     "--output: cannot create", []),
    ("export: negative version",
     "export --run-dir {t}/run --max-source-length 16 --base {t}/models --name m --version -1",
     "--version must be a non-negative integer. Received: -1", ["models/m/-1"]),
    ("export: version taken",
     "export --run-dir {t}/run --max-source-length 16 --base {t}/models --name m --version 1",
     "models/m/1 already exists; choose another --version, or leave it out for the next free "
     "one (3)", []),
    ("export: run folder without a model",
     "export --run-dir {t}/none", "model not found", []),
    ("export: base cannot be created",
     "export --run-dir {t}/run --max-source-length 16 --base {t}/a_file",
     "--base/--name: cannot create", []),
    ("ct2-export: output exists",
     "ct2-export --run-dir {t}/run --max-source-length 16 --output {t}/ct2",
     "--output: {t}/ct2 exists; pass --force", []),
    ("export: negative alpha",
     "export --run-dir {t}/run --max-source-length 16 --base {t}/models --name m --alpha -1",
     "--alpha must be 0 or positive. Received: -1.0", []),
    ("export: not a SentencePiece model",
     "export --model {t}/kept.keras --sentencepiece {t}/in.en --max-source-length 16 "
     "--base {t}/models --name m", "{t}/in.en is not a SentencePiece model", []),
    ("export: a model of one's own without its source length",
     "export --model {t}/kept.keras --sentencepiece {t}/run/sentencepiece.model --base {t}/models "
     "--name own",
     "holds no run's config.json to read it from; give the longest source", ["models/own"]),
    ("ct2-export: unknown quantization",
     "ct2-export --run-dir {t}/run --max-source-length 16 --output {t}/new --quantization int3",
     "--quantization must be one of int8, ", ["new"]),
    ("evaluate: no lines", "evaluate --hypotheses {t}/empty.txt --references {t}/empty.txt",
     "{t}/empty.txt has no lines to score against", []),
    ("attention: not an image file",
     "attention --run-dir {t}/run --source a --output {t}/a.pngg",
     "--output {t}/a.pngg: not an image file matplotlib writes", ["a.pngg"]),
    ("train: output folder cannot be created",
     "train --output-dir {t}/a_file/run", "output_dir: cannot create the folder", []),
    ("train: wrong type", "train --set steps=abc", "steps must be an integer", []),
    ("train: heads that do not divide the model size",
     "train --set model.num_heads=3", "num_heads must divide hidden_dim", []),
    ("train: config file holding a list",
     "train --config {t}/list.json", "must hold a JSON object of settings", []),
    ("no such command", "transmogrify", "unknown command 'transmogrify'", []),
]  # fmt: skip


def exit_status(argv):
    try:
        return cli.main(argv)
    except SystemExit as exit_info:
        return exit_info.code


@pytest.mark.parametrize("name, argv, message, absent", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_before_any_work(
    files, no_work, capsys, name, argv, message, absent
):
    (files / "list.json").write_text("[1, 2]")
    before = sorted(str(p.relative_to(files)) for p in files.rglob("*"))
    assert exit_status(argv.format(t=files).split()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert message.format(t=files) in err[0]
    assert "Traceback" not in err[0]
    for path in absent:
        assert not (files / path).exists()
    # Nothing written, nothing lost: the folder holds what it held.
    after = sorted(str(p.relative_to(files)) for p in files.rglob("*"))
    assert after == before
    assert (files / "kept.keras").read_bytes() == GOOD


def test_export_on_another_keras_backend_is_refused_before_any_work(
    files, no_work, capsys, monkeypatch
):
    monkeypatch.setattr(checkpoints.keras.backend, "backend", lambda: "jax")
    argv = ["export", "--run-dir", str(files / "run"), "--max-source-length", "16",
            "--base", str(files / "models"), "--name", "other"]  # fmt: skip
    assert exit_status(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: kt export writes a TensorFlow graph and needs KERAS_BACKEND=tensorflow, not jax"
    )
    assert not (files / "models" / "other").exists()


def test_a_corrupt_checkpoint_is_called_corrupt_not_missing(files, capsys):
    argv = ["average", str(files / "broken.keras"), str(files / "kept.keras")]
    assert exit_status(argv + ["--output", str(files / "kept.keras")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{files}/broken.keras: the file is corrupt or truncated" in err
    assert "not found" not in err
    assert (files / "kept.keras").read_bytes() == GOOD


def test_stale_staging_of_dead_processes_is_removed_and_live_ones_kept(tmp_path):
    import socket
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()
    dead, alive = f"{int(finished.stdout)}@{host}", f"{os.getpid()}@{host}"
    elsewhere = f"{int(finished.stdout)}@another-{host}"  # shared storage: not ours to judge
    names = [f"{STAGING}{dead}-abc", f"{STAGING}{dead}-x.keras", f"{STAGING}{alive}-def"]
    names.append(f"{STAGING}{elsewhere}-ghi")
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "1").mkdir()
    removed = remove_stale_staging(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == names[:2]
    assert sorted(os.listdir(tmp_path)) == sorted(["1", *names[2:]])


def test_atomic_outputs_get_the_mode_a_plain_write_gets(tmp_path):
    from pipelines.files import write_json

    (tmp_path / "plain.json").write_text("{}")
    write_json(str(tmp_path / "atomic.json"), {})
    modes = [os.stat(tmp_path / name).st_mode & 0o777 for name in ("plain.json", "atomic.json")]
    assert modes[0] == modes[1]


class Killed(BaseException):
    """Stands for SIGKILL in-process: nothing after it runs in the command."""


def fake_translator(monkeypatch, calls, die_after=None):
    """`kt translate` with a SavedModel that upper-cases, optionally dying mid-file.

    Sampling appends each row's seed to its line, so that the outputs show
    which random stream each sample came from.
    """

    def call_in_batches(signature, lines, batch_size, rows=None, scalars=None):
        if die_after is not None and len(calls) == die_after:
            raise Killed
        calls.append(len(lines))
        texts = [line.decode(errors="replace").upper() for line in lines]
        if rows and "seed" in rows:
            texts = [f"{text} {seed}" for text, seed in zip(texts, rows["seed"][0], strict=True)]
        outputs = {"translations": [text.encode() for text in texts]}
        if rows and "prefixes" in rows:  # alignments: each word to itself
            pieces = [np.array([f"\u2581{w}".encode() for w in line.split()]) for line in texts]
            outputs["source_pieces"] = outputs["target_pieces"] = pieces
            outputs["alignments"] = [np.arange(len(words)) for words in pieces]
        return outputs

    def load_signature(path, name):
        graph = pathlib.Path(path, "saved_model.pb")  # the version the output records
        graph.exists() or graph.touch()
        return path, name

    monkeypatch.setattr(client, "load_signature", load_signature)
    monkeypatch.setattr(client, "call_in_batches", call_in_batches)


def killed_after(monkeypatch, argv, batches):
    """Runs `kt ARGV` with the fake translator until it is killed after `batches` batches."""
    fake_translator(monkeypatch, [], die_after=batches)
    with pytest.raises(Killed):
        cli.main(argv)


def rerun(monkeypatch, argv):
    """Runs `kt ARGV` again to its end; returns the sizes of the batches it translated."""
    calls = []
    fake_translator(monkeypatch, calls)
    assert cli.main(argv) == 0
    return calls


def test_a_killed_translation_resumes_where_it_stopped(tmp_path, monkeypatch, capsys):
    lines = [f"sentence {i}" for i in range(10)]
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n")
    output = tmp_path / "out" / "out.de"  # its folder does not exist yet
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--output", str(output), "--batch-size", "3"]  # fmt: skip
    killed_after(monkeypatch, argv, 2)
    # Two batches were done and kept, in input order; the output has no name yet.
    partial = output.parent / "out.de.partial"
    assert partial.read_text().splitlines() == [line.upper() for line in lines[:6]]
    assert not output.exists()
    # A line cut by the kill is translated again.
    with open(partial, "a") as handle:
        handle.write("SENT")
    assert rerun(monkeypatch, argv) == [3, 1]  # only what was left
    assert output.read_text().splitlines() == [line.upper() for line in lines]
    assert "resuming after 6 lines" in capsys.readouterr().err
    assert sorted(os.listdir(output.parent)) == ["out.de"]


def test_a_partial_translation_of_another_input_is_started_over(tmp_path, monkeypatch):
    (tmp_path / "in.en").write_text("a\nb\nc\n")
    output = tmp_path / "out.de"
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--output", str(output), "--batch-size", "2"]  # fmt: skip
    killed_after(monkeypatch, argv, 1)
    (tmp_path / "in.en").write_text("x\ny\nz\n")
    assert rerun(monkeypatch, argv) == [2, 1] and output.read_text() == "X\nY\nZ\n"


def test_translation_to_stdout_writes_each_batch_as_it_ends(tmp_path, monkeypatch, capsys):
    (tmp_path / "in.en").write_text("a\nb\nc\n")
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en")]
    killed_after(monkeypatch, argv + ["--batch-size", "2"], 1)
    assert capsys.readouterr().out == "A\nB\n"


def test_a_killed_sampling_run_resumes_to_the_samples_of_an_unbroken_run(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "in.en").write_text("".join(f"line {i}\n" for i in range(7)))
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--num-samples", "2", "--sampling-topk", "5", "--seed", "3",
            "--batch-size", "4"]  # fmt: skip
    fake_translator(monkeypatch, [])
    assert cli.main(argv + ["--output", str(tmp_path / "whole.txt")]) == 0
    whole = (tmp_path / "whole.txt").read_text().splitlines()
    assert len(whole) == 14 and whole[0].startswith("LINE 0 ") and whole[2].startswith("LINE 1 ")
    assert len(set(whole)) == 14  # every sample its own seed
    broken = argv + ["--output", str(tmp_path / "broken.txt")]
    killed_after(monkeypatch, broken, 2)  # two input lines a call
    with open(tmp_path / "broken.txt.partial", "a") as handle:
        handle.write("LINE 4 123\n")  # one of line 4's two samples: line 4 is redone
    assert rerun(monkeypatch, broken) == [4, 2]
    assert "resuming after 4 lines" in capsys.readouterr().err
    assert (tmp_path / "broken.txt").read_text().splitlines() == whole


def test_a_killed_run_with_alignments_resumes_both_files(tmp_path, monkeypatch):
    (tmp_path / "in.en").write_text("a b\nc\nd e f\n")
    output, alignments = tmp_path / "out.de", tmp_path / "out.align"
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--output", str(output), "--alignments", str(alignments),
            "--batch-size", "2"]  # fmt: skip
    killed_after(monkeypatch, argv, 1)
    assert (tmp_path / "out.align.partial").read_text() == "0-0 1-1\n0-0\n"
    assert rerun(monkeypatch, argv) == [1]
    assert output.read_text() == "A B\nC\nD E F\n"
    assert alignments.read_text() == "0-0 1-1\n0-0\n0-0 1-1 2-2\n"
    assert sorted(os.listdir(tmp_path)) == ["in.en", "out.align", "out.de", "saved_model.pb"]


def test_alignments_beside_stdout_are_started_over_with_it(tmp_path, monkeypatch, capsys):
    """Resuming the alignments would leave stdout without the lines done before the kill."""
    (tmp_path / "in.en").write_text("a b\nc\nd e f\n")
    alignments = tmp_path / "out.align"
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--alignments", str(alignments), "--batch-size", "2"]  # fmt: skip
    killed_after(monkeypatch, argv, 1)
    assert capsys.readouterr().out == "A B\nC\n"
    assert (tmp_path / "out.align.partial").read_text() == "0-0 1-1\n0-0\n"
    assert rerun(monkeypatch, argv) == [2, 1]  # everything again
    assert capsys.readouterr().out == "A B\nC\nD E F\n"
    assert alignments.read_text() == "0-0 1-1\n0-0\n0-0 1-1 2-2\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sampling-topp", "1.5"], "--sampling-topp must be in (0, 1]. Received: 1.5"),
        (["--sampling-topp", "0"], "--sampling-topp must be in (0, 1]. Received: 0.0"),
        (["--sampling-topk", "-1"], "--sampling-topk must be 0 (no cut) or positive. Received: -1"),
        (["--sampling-temperature", "0"], "--sampling-temperature must be positive. Received: 0.0"),
        (["--num-samples", "0"], "--num-samples must be positive. Received: 0"),
        (["--alpha", "-0.5"], "--alpha must be 0 or positive. Received: -0.5"),
        (["--seed", "1"], "--seed applies to sampling only (--sampling-*, --num-samples)"),
        (["--num-samples", "2", "--seed", "-1"], "--seed must be 0 or positive. Received: -1"),
        (["--num-samples", "2", "--beam-size", "4"],
         "--beam-size does not apply to sampling (--sampling-*, --num-samples)"),
        (["--alpha", "0.2", "--alignments", "a.txt"],
         "--alpha does not apply with --alignments, which searches with the export's beam size "
         "and length penalty (kt export --beam-size, --alpha)"),
        (["--disable-unk", "--alignments", "a.txt"],
         "--disable-unk does not apply with --alignments, which searches with the export's "
         "beam size and length penalty (kt export --beam-size, --alpha)"),
        (["--num-samples", "2", "--alignments", "a.txt"],
         "--sampling-* does not apply with --alignments, which searches with the export's "
         "beam size and length penalty (kt export --beam-size, --alpha)"),
        (["--no-repeat-ngram-size", "-1"],
         "--no-repeat-ngram-size must be 0 (off) or positive. Received: -1"),
        (["--repetition-penalty", "0"],
         "--repetition-penalty must be positive and finite. Received: 0.0"),
        (["--repetition-penalty", "inf"],
         "--repetition-penalty must be positive and finite. Received: inf"),
        (["--min-length", "-2"], "--min-length must be 0 (off) or positive. Received: -2"),
        (["--max-output-length", "0"], "--max-output-length must be positive. Received: 0"),
        (["--min-length", "9", "--max-length", "4"],  # its earlier name still works
         "--min-length 9 is above --max-output-length 4"),
    ],
)  # fmt: skip
def test_translate_refuses_bad_or_clashing_decoding_settings(tmp_path, capsys, flags, message):
    argv = ["translate", "--model", str(tmp_path / "none"), *flags]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_a_truncated_newest_version_is_named_with_an_older_one(files, capsys):
    models = files / "models" / "m"
    (models / "2" / "saved_model.pb").write_bytes(b"\x0a\x05trunc")  # cut short
    argv = ["translate", "--model", str(models), "--input", str(files / "in.en")]
    assert exit_status(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: the SavedModel {models}/2 is broken: "), err
    assert err[0].endswith(f"an older version: --model {models}/1")


def test_a_second_translation_onto_the_same_output_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "in.en").write_text("a\nb\n")
    output = tmp_path / "out.de"
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en"),
            "--output", str(output)]  # fmt: skip
    calls = []
    fake_translator(monkeypatch, calls)
    with output_lock(str(output), "--output"):  # a first run, still writing
        assert cli.main(argv) == 2
        assert calls == [] and not output.exists()  # refused before any work
        err = capsys.readouterr().err.strip()
        assert err == (
            f"error: --output {output} is being written by another run (process {os.getpid()}); "
            "wait for it to finish, or choose another --output"
        )
    assert cli.main(argv) == 0 and output.read_text() == "A\nB\n"
    assert sorted(os.listdir(tmp_path)) == ["in.en", "out.de", "saved_model.pb"]  # no lock left


def test_translation_warns_of_lines_that_are_not_utf8(tmp_path, monkeypatch, capsys):
    (tmp_path / "in.en").write_bytes(b"good\ncaf\xc3\nfine\n\xff\xfe\n")
    fake_translator(monkeypatch, [])
    argv = ["translate", "--model", str(tmp_path), "--input", str(tmp_path / "in.en")]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4
    assert (
        f"warning: --input {tmp_path / 'in.en'}: 2 lines are not valid UTF-8 (lines 2, 4); "
        "their invalid bytes are translated as U+FFFD"
    ) in captured.err
