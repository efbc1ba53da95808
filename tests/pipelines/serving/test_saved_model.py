"""SavedModel export: fresh-process serving, saved_model_cli, TF Serving ops, bad input."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer import beam_search, greedy_search, score_hypotheses
from pipelines.commands import export as export_command
from pipelines.commands import translate as translate_command
from pipelines.data.tokenizer import EOS_ID
from pipelines.errors import ExportError
from pipelines.serving.client import export_settings
from pipelines.serving.controls import CONTROLS, NEUTRAL, control_tensors, controls_on
from pipelines.serving.saved_model import Translator, export
from pipelines.serving.signatures import SIGNATURES
from pipelines.serving.translation import decode, encode, translate_strings
from pipelines.serving.versions import next_version
from pipelines.serving.warmup import (
    batcher_accepts,
    read_warmup_requests,
    write_warmup_requests,
)
from tests.pipelines.conftest import tiny_translation_model

# One worker runs the module, so its module fixtures are built once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("saved_model")

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SOURCE_LENGTH = 12
LONG = "1,234.5 kilometers and " * 8
INVALID = b"caf\xc3 \xff 5 kg"
INPUTS = [b"Monday, March 3, 2014", b"4:08 PM", b"", b"   ", LONG.encode(), INVALID, b"12.5%"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def tiny_export(root, quantize=None):
    """A tiny untrained model exported with beam 4, 3 hypotheses, chunks of 3 sentences.

    Returns:
        `(translator, model, sentencepiece_path, version_path)`.
    """
    model, spm_path = tiny_translation_model(
        root, 150, num_layers=1, hidden_dim=32, intermediate_dim=64, num_heads=2
    )
    translator = Translator(
        model, spm_path, MAX_SOURCE_LENGTH, beam_size=4, alpha=0.6, num_hypotheses=3,
        chunk_size=3, quantize=quantize,
    )  # fmt: skip
    path = export(translator, str(root / "saved_models" / "tiny"))
    return translator, model, spm_path, path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return tiny_export(tmp_path_factory.mktemp("export"))


def keras_beam_search(translator, model, sentences):
    """The Keras model's beam search on the whole batch, outside any SavedModel."""

    @tf.function
    def run(sentences):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        tokens, scores = beam_search(model, source, beam_size=4, alpha=0.6, num_hypotheses=3)
        return decode(translator.tokenizer, tokens, EOS_ID), scores

    texts, scores = run(tf.constant(sentences))
    return [[t.decode("utf-8") for t in row] for row in texts.numpy()], scores.numpy()


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    _, _, _, path = exported
    inputs_path = tmp_path_factory.mktemp("client") / "inputs.json"
    inputs_path.write_text(json.dumps([text.decode("latin-1") for text in INPUTS]))
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "serving_client.py"), path, str(inputs_path)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=str(inputs_path.parent),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_layout_and_asset(exported):
    _, _, spm_path, path = exported
    assert os.path.basename(path) == "1" and os.path.basename(os.path.dirname(path)) == "tiny"
    with open(os.path.join(path, "assets", "sentencepiece.model"), "rb") as handle:
        assert handle.read() == open(spm_path, "rb").read()
    assert os.listdir(os.path.dirname(path)) == ["1"]  # no staging folder left behind


def test_fresh_process_serves_the_keras_beam_search(exported, served):
    translator, model, _, _ = exported
    assert served["modules"] == []
    assert served["signatures"] == [
        "align",
        "controlled",
        "controlled_sample",
        "controlled_search",
        "nbest",
        "prefix",
        "sample",
        "score",
        "serving_default",
        "translate",
    ]
    assert served["asset"].endswith(os.path.join("assets", "sentencepiece.model"))
    real = [0, 1, 4, 6]
    expected, expected_scores = keras_beam_search(translator, model, [INPUTS[i] for i in real])
    for row, index in enumerate(real):
        assert served["translations"][index] == expected[row][0]
        assert served["nbest"][index] == expected[row]
        np.testing.assert_allclose(served["scores"][index], expected_scores[row, 0], rtol=1e-4)
        np.testing.assert_allclose(served["nbest_scores"][index], expected_scores[row], rtol=1e-4)
    assert np.all(np.diff(np.array(served["nbest_scores"]), axis=1) <= 0)


def test_translate_signature_with_beam_1_is_greedy_search(exported, served):
    translator, model, _, _ = exported
    real = [0, 1, 4, 6]

    @tf.function
    def greedy(sentences):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        tokens, scores = greedy_search(model, source, alpha=0.6, return_scores=True)
        return decode(translator.tokenizer, tokens, EOS_ID), scores

    texts, scores = greedy(tf.constant([INPUTS[i] for i in real]))
    assert [served["greedy"][i] for i in real] == [t.decode() for t in texts.numpy()]
    np.testing.assert_allclose([served["greedy_scores"][i] for i in real], scores, rtol=1e-4)


def test_bad_input_gives_one_output_per_input_in_order(exported, served):
    translator, model, _, _ = exported
    assert len(served["translations"]) == len(INPUTS)
    assert served["translations"] == served["alone"]  # batching changes nothing
    for index in (2, 3):  # empty and all-space sentences
        assert served["translations"][index] == "" and served["scores"][index] == 0.0
    # The long sentence is truncated to MAX_SOURCE_LENGTH ids and translated.
    assert len(translator.tokenizer.tokenize(LONG).numpy()) > MAX_SOURCE_LENGTH
    # Invalid UTF-8 is translated as if each bad byte were U+FFFD.
    replaced = INVALID.decode("utf-8", errors="replace").encode()
    expected, _ = keras_beam_search(translator, model, [replaced])
    assert served["translations"][5] == expected[0][0]
    assert served["empty_batch_rows"] == 0


def test_the_score_signature_scores_as_beam_search_and_score_hypotheses_do(exported, served):
    """Scores of text pairs equal `score_hypotheses` on their ids, in a fresh process.

    `score_hypotheses` gives beam search's own scores for its outputs
    (tests/test_decoding.py); through text that holds where an output's text
    tokenizes back to the same ids, which this untrained model's are not.
    """
    translator, model, _, _ = exported
    real = [0, 1, 4, 5, 6]  # every sentence with a source (empty ones translate to "")
    sources = tf.constant([INPUTS[i] for i in real])
    targets = tf.constant([served["beam_alpha0_translations"][i] for i in real])
    source = encode(translator.tokenizer, sources, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
    target = encode(translator.tokenizer, targets, EOS_ID).to_tensor()
    scored = np.array([served["scored"][i] for i in real])
    np.testing.assert_allclose(scored, score_hypotheses(model, source, target), rtol=1e-4)
    assert [served["scored_lengths"][i] for i in real] == list(np.sum(target.numpy() != 0, 1))


def test_every_signature_but_translate_and_controlled_search_is_batch_major(exported):
    """What TF Serving's batcher can merge: every input and output has a leading batch axis."""
    loaded = tf.saved_model.load(exported[3])
    assert len(loaded.signatures) == 10
    for name, signature in loaded.signatures.items():
        inputs = signature.structured_input_signature[1]
        outputs = signature.structured_outputs.values()
        if name in ("translate", "controlled_search"):  # scalar search settings: not batchable
            scalars = sorted(key for key, spec in inputs.items() if len(spec.shape) == 0)
            assert scalars == ["alpha", "beam_size", "penalty_form"], name
            inputs = {key: spec for key, spec in inputs.items() if key not in scalars}
        inputs = inputs.values()
        for spec in [*inputs, *outputs]:
            assert len(spec.shape) >= 1 and spec.shape[0] is None, (name, spec)


def test_the_translate_signature_takes_the_length_penalty_form_per_request(exported):
    translator, model, _, path = exported
    translate = tf.saved_model.load(path).signatures["translate"]
    sentences = [b"Monday, March 3, 2014", b"4:08 PM", b"12.5%", b"1,234.5 kilometers"]

    @tf.function
    def keras_search(sentences, penalty_form):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        tokens, scores = beam_search(model, source, alpha=1.0, penalty_form=penalty_form)
        return decode(translator.tokenizer, tokens, EOS_ID)[:, 0], scores[:, 0]

    results = {}
    for form in ("gnmt", "power", ""):
        outputs = translate(
            inputs=tf.constant(sentences), beam_size=tf.constant(4),
            alpha=tf.constant(1.0), penalty_form=tf.constant(form),
        )  # fmt: skip
        results[form] = outputs["translations"].numpy(), outputs["scores"].numpy()
        texts, scores = keras_search(tf.constant(sentences), form or "gnmt")  # "": the export's
        assert list(results[form][0]) == list(texts.numpy())
        np.testing.assert_allclose(results[form][1], scores.numpy(), rtol=1e-4)
    assert not np.allclose(results["gnmt"][1], results["power"][1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="penalty_form must be one of"):
        translate(
            inputs=tf.constant(sentences), beam_size=tf.constant(4),
            alpha=tf.constant(1.0), penalty_form=tf.constant("GNMT"),
        )  # fmt: skip


def test_a_forced_end_leaves_a_prefix_one_piece_less(exported):
    translator, model, _, _ = exported
    sentences, prefixes = tf.constant([b"4:08 PM", b"12.5%"]), tf.constant([b"", b"16:08"])
    pieces = int(encode(translator.tokenizer, prefixes, None).row_lengths()[1])
    lengths = {"max_output_length": pieces, "end_at_limit": False}
    texts, _ = translate_strings(model, translator.tokenizer, sentences, 1, 0.6,
                                 prefixes=prefixes, lengths=lengths)  # fmt: skip
    assert texts.numpy()[1, 0].decode().startswith("16")  # the limit holds the prefix
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"less its forced end\); rows:"):
        translate_strings(model, translator.tokenizer, sentences, 1, 0.6, prefixes=prefixes,
                          lengths={**lengths, "end_at_limit": True})  # fmt: skip


def test_translate_command_refuses_the_penalty_form_for_an_export_before_it(
    exported, tmp_path, monkeypatch, capsys
):
    from pipelines import cli
    from pipelines.serving import client

    monkeypatch.setattr(client, "takes", lambda signature, name: False)  # an older export
    source = write_lines(tmp_path / "in.txt", [b"4:08 PM"])
    argv = ["translate", "--model", exported[3], "--input", source, "--penalty-form", "power"]
    assert cli.main(argv) == 2
    assert "--penalty-form: the export" in capsys.readouterr().err
    with pytest.raises(ExportError, match="has no penalty_form"):
        client.translate_lines(None, [b"4:08 PM"], penalty_form="power")


def keras_prefix_search(translator, model, sentences, prefixes):
    """Keras beam search with target prefixes and alignments, outside any SavedModel."""

    @tf.function
    def run(sentences, prefixes):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        prefix = encode(translator.tokenizer, prefixes, None).to_tensor(shape=[None, 20])
        tokens, scores, attention = beam_search(
            model, source, beam_size=4, alpha=0.6, target_prefix=prefix, return_attention=True
        )
        return decode(translator.tokenizer, tokens, EOS_ID), scores, tokens, attention, source

    outputs = run(tf.constant(sentences), tf.constant(prefixes))
    texts, scores, tokens, attention, source = (output.numpy() for output in outputs)
    return (
        [t[0].decode("utf-8") for t in texts],
        scores[:, 0],
        tokens[:, 0],
        attention[:, 0],
        source,
    )


def test_prefix_signature_is_keras_beam_search_with_a_target_prefix(exported, served):
    translator, model, _, _ = exported
    real = [0, 1, 4, 5, 6]
    prefixes = [served["prefixes"][i] for i in real]
    assert [p for p in prefixes if p]  # some sentences have a prefix, some have none
    texts, scores, *_ = keras_prefix_search(translator, model, [INPUTS[i] for i in real], prefixes)
    assert [served["prefixed"][i] for i in real] == texts
    np.testing.assert_allclose([served["prefixed_scores"][i] for i in real], scores, rtol=1e-4)
    for prefix, text in zip(prefixes, texts, strict=True):
        assert text.startswith(prefix.strip())
    for index in (2, 3):  # empty sentences stay empty
        assert served["prefixed"][index] == ""


def test_align_signature_gives_the_searchs_attention_as_piece_positions(exported, served):
    translator, model, _, _ = exported
    aligned = served["aligned"]
    assert aligned["translations"] == served["prefixed"]
    real = [0, 1, 4, 5, 6]
    _, _, tokens, attention, source = keras_prefix_search(
        translator, model, [INPUTS[i] for i in real], [served["prefixes"][i] for i in real]
    )
    pieces = translator.tokenizer.id_to_string
    for row, index in enumerate(real):
        # Pieces: the tokens before the end of sentence, which padding follows.
        count = int(np.sum((np.cumsum(tokens[row] == EOS_ID) == 0) & (tokens[row] != 0)))
        target = [p.decode() for p in pieces(tokens[row, :count]).numpy()]
        assert aligned["target_pieces"][index][:count] == target
        assert set(aligned["target_pieces"][index][count:]) <= {""}
        source_count = int(np.sum(source[row] != 0)) - 1  # end of sentence left out
        expected = np.argmax(attention[row, :count], axis=-1)
        expected = np.where(expected < source_count, expected, -1)
        assert aligned["alignments"][index][:count] == expected.tolist()
        assert set(aligned["alignments"][index][count:]) <= {-1}
        source_pieces = [p.decode() for p in pieces(source[row, :source_count]).numpy()]
        assert aligned["source_pieces"][index][:source_count] == source_pieces
    assert set(aligned["alignments"][2]) == {-1} and set(aligned["source_pieces"][2]) == {""}


def test_sample_signature_draws_each_sentence_from_its_own_seed(exported, served):
    translator, model, _, _ = exported
    real = [0, 1, 4, 5, 6]
    assert [served["sampled_top_1"][i] for i in real] == [served["greedy"][i] for i in real]
    assert served["sampled"] == served["sampled_reversed"]  # order and company change nothing
    assert served["sampled"] != served["sampled_other_seeds"]
    assert served["sampled"][2] == "" and served["sampled_scores"][2] == 0.0
    # Scores are the samples' log-probabilities (checked against the model in
    # tests/test_sampling.py; these garbage samples do not tokenize back to their ids).
    assert all(served["sampled_scores"][i] < 0 for i in real)


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("temperature", 0.0, "temperature must be positive"),
        ("top_k", -1, "top_k must be 0"),
        ("top_p", 1.5, "top_p must be in \\(0, 1\\]"),
        ("top_p", 0.0, "top_p must be in \\(0, 1\\]"),
    ],
)
def test_sample_signature_refuses_bad_settings_naming_the_row(exported, setting, value, message):
    signature = exported[0].signatures()["sample"]
    settings = {"temperature": [1.0, 1.0], "top_k": [0, 0], "top_p": [1.0, 1.0], "seed": [1, 2]}
    settings[setting] = [settings[setting][0], value]
    dtypes = {"temperature": tf.float32, "top_k": tf.int32, "top_p": tf.float32, "seed": tf.int64}
    tensors = {key: tf.constant(v, dtypes[key]) for key, v in settings.items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{message}(.|\\n)*\\[1\\]"):
        signature(inputs=tf.constant(["4:08 PM", "12.5%"]), **tensors)


# One sentence's controls a row: off; a bigram ban, penalty, max length and banned words;
# a minimum length, unigram ban and <unk>; an impossible banned phrase.
CONTROLLED = {
    "no_repeat_ngram_size": ([0, 2, 1, 0], tf.int32),
    "repetition_penalty": ([1.0, 1.5, 1.0, 0.8], tf.float32),
    "min_length": ([0, 0, 6, 0], tf.int32),
    "max_length": ([0, 9, 0, 0], tf.int32),
    "disable_unk": ([False, False, True, False], tf.bool),
    "banned_words": (["", "March\n4:08 PM", "", "no such phrase"], tf.string),
}
CONTROLLED_INPUTS = [b"Monday, March 3, 2014", b"4:08 PM", LONG.encode(), b"12.5%"]


def test_controlled_signature_is_keras_beam_search_with_each_sentences_controls(exported, served):
    translator, model, _, _ = exported
    controls = {name: tf.constant(values, dtype) for name, (values, dtype) in CONTROLLED.items()}
    outputs = translator.signatures()["controlled"](
        inputs=tf.constant(CONTROLLED_INPUTS), **controls
    )

    @tf.function
    def keras_search(sentences):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        settings = control_tensors(translator.tokenizer, sentences, controls)
        tokens, scores = beam_search(model, source, beam_size=4, alpha=0.6, controls=settings)
        return decode(translator.tokenizer, tokens[:, 0], EOS_ID), scores[:, 0], tokens[:, 0]

    texts, scores, tokens = keras_search(tf.constant(CONTROLLED_INPUTS))
    assert outputs["translations"].numpy().tolist() == texts.numpy().tolist()
    np.testing.assert_allclose(outputs["scores"].numpy(), scores.numpy(), rtol=1e-4)
    plain = translator.signatures()["serving_default"](inputs=tf.constant(CONTROLLED_INPUTS))
    changed = outputs["translations"].numpy() != plain["translations"].numpy()
    assert list(changed) == [False, True, True, True]  # neutral controls change nothing
    lengths = np.sum((tokens.numpy() != 0) & (tokens.numpy() != EOS_ID), axis=1)
    assert lengths[1] <= 9 and lengths[2] >= 6
    assert b"March" not in outputs["translations"].numpy()[1]
    assert served["controlled_neutral"] == served["translations"]  # in a fresh process too


COMBINED_PREFIXES = [b"", b"March", b"kilometers", b""]


@pytest.mark.parametrize("beam_size, alpha, form", [(1, 0.0, "gnmt"), (3, 1.0, "power")])
def test_controlled_search_is_keras_search_with_any_beam_prefixes_and_controls(
    exported, beam_size, alpha, form
):
    translator, model, _, _ = exported
    signatures = translator.signatures()
    controls = {name: tf.constant(values, dtype) for name, (values, dtype) in CONTROLLED.items()}
    sentences, prefixes = tf.constant(CONTROLLED_INPUTS), tf.constant(COMBINED_PREFIXES)
    scalars = {"beam_size": tf.constant(beam_size), "alpha": tf.constant(alpha)}
    outputs = signatures["controlled_search"](
        inputs=sentences, prefixes=prefixes, penalty_form=tf.constant(form), **controls, **scalars
    )

    @tf.function
    def keras_search(sentences, prefixes):
        source = encode(translator.tokenizer, sentences, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
        prefix = encode(translator.tokenizer, prefixes, None).to_tensor(shape=[None, 20])
        settings = control_tensors(translator.tokenizer, sentences, controls)
        tokens, scores = beam_search(
            model, source, beam_size=beam_size, alpha=alpha, target_prefix=prefix,
            controls=settings, penalty_form=form,
        )  # fmt: skip
        return decode(translator.tokenizer, tokens[:, 0], EOS_ID), scores[:, 0]

    texts, scores = keras_search(sentences, prefixes)
    assert outputs["translations"].numpy().tolist() == texts.numpy().tolist()
    np.testing.assert_allclose(outputs["scores"].numpy(), scores.numpy(), rtol=1e-4)
    assert outputs["translations"].numpy()[1].startswith(b"March")
    # Neutral controls and no prefixes: `translate`'s search, whatever the beam size.
    neutral = {name: tf.fill([4], NEUTRAL[name]) for name in CONTROLS}
    plain = signatures["controlled_search"](
        inputs=sentences, prefixes=tf.fill([4], ""), penalty_form=tf.constant(form),
        **neutral, **scalars,
    )  # fmt: skip
    expected = signatures["translate"](inputs=sentences, penalty_form=tf.constant(form), **scalars)
    assert plain["translations"].numpy().tolist() == expected["translations"].numpy().tolist()
    np.testing.assert_allclose(plain["scores"], expected["scores"], rtol=1e-5)


def test_controlled_sample_draws_with_each_sentences_prefix_and_controls(exported):
    translator, model, _, _ = exported
    signatures = translator.signatures()
    rows = len(CONTROLLED_INPUTS)
    sentences = tf.constant(CONTROLLED_INPUTS)
    controls = {name: tf.constant(values, dtype) for name, (values, dtype) in CONTROLLED.items()}
    neutral = {name: tf.fill([rows], NEUTRAL[name]) for name in CONTROLS}
    draws = {"temperature": tf.fill([rows], 1.0), "top_p": tf.fill([rows], 1.0),
             "seed": tf.range(rows, dtype=tf.int64)}  # fmt: skip
    # Neutral, without prefixes: the `sample` signature's draws, seed for seed.
    free = signatures["controlled_sample"](
        inputs=sentences, prefixes=tf.fill([rows], ""), top_k=tf.fill([rows], 0),
        **neutral, **draws,
    )  # fmt: skip
    expected = signatures["sample"](inputs=sentences, top_k=tf.fill([rows], 0), **draws)
    assert free["translations"].numpy().tolist() == expected["translations"].numpy().tolist()
    # Top-1 sampling with prefixes and controls: the greedy search with the same.
    greedy = signatures["controlled_sample"](
        inputs=sentences, prefixes=tf.constant(COMBINED_PREFIXES), top_k=tf.fill([rows], 1),
        **controls, **draws,
    )  # fmt: skip
    searched = signatures["controlled_search"](
        inputs=sentences, prefixes=tf.constant(COMBINED_PREFIXES), beam_size=tf.constant(1),
        alpha=tf.constant(0.0), penalty_form=tf.constant(""), **controls,
    )  # fmt: skip
    assert greedy["translations"].numpy().tolist() == searched["translations"].numpy().tolist()
    np.testing.assert_allclose(greedy["scores"], searched["scores"], rtol=1e-4)
    plain = signatures["controlled_sample"](
        inputs=sentences, prefixes=tf.fill([rows], ""), top_k=tf.fill([rows], 1),
        **neutral, **draws,
    )  # fmt: skip
    changed = greedy["translations"].numpy() != plain["translations"].numpy()
    assert list(changed[1:]) == [True, True, True]  # a prefix or a control on each of these


def test_banned_words_become_right_aligned_pieces(exported):
    tokenizer = exported[0].tokenizer
    ids = control_tensors(
        tokenizer,
        tf.constant(["a", "b", "c"]),
        {**{name: [value] * 3 for name, value in NEUTRAL.items()},
         "banned_words": ["March\n4:08 PM", "", " \n12.5%"]},
    )["banned_tokens"].numpy()  # fmt: skip
    expected = [tokenizer.tokenize(text).numpy().tolist() for text in ("March", "4:08 PM", "12.5%")]
    width = max(len(pieces) for pieces in expected) + 1
    rows = [
        [[-1] * (width - len(p)) + p for p in expected[:2]],
        [],
        [[-1] * (width - len(expected[2])) + expected[2]],
    ]
    assert ids.shape == (3, 2, width)
    for row, phrases in zip(ids.tolist(), rows, strict=True):
        assert row[: len(phrases)] == phrases and all(set(p) == {-1} for p in row[len(phrases) :])


@pytest.mark.parametrize(
    "setting, value",
    [
        ("no_repeat_ngram_size", 2),
        ("repetition_penalty", 0.9),
        ("min_length", 1),
        ("max_length", 5),
        ("disable_unk", True),
        ("banned_words", "March"),
    ],
)
def test_one_sentences_one_control_turns_the_controlled_search_on(exported, setting, value):
    """A request whose controls are all off runs the search without them (`controls_on`)."""
    tokenizer = exported[0].tokenizer
    neutral = {name: [value] * 3 for name, value in NEUTRAL.items()}
    sentences = tf.constant(["a", "b", "c"])
    assert not controls_on(control_tensors(tokenizer, sentences, neutral)).numpy()
    one = {**neutral, setting: [NEUTRAL[setting], value, NEUTRAL[setting]]}
    assert controls_on(control_tensors(tokenizer, sentences, one)).numpy()


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("no_repeat_ngram_size", -1, "no_repeat_ngram_size must be 0"),
        ("repetition_penalty", 0.0, "repetition_penalty must be positive"),
        ("repetition_penalty", float("inf"), "repetition_penalty must be positive and finite"),
        ("min_length", 10, "min_length must not exceed max_length"),
        ("max_length", -2, "max_length must be 0"),
    ],
)
def test_controlled_signature_refuses_bad_settings_naming_the_row(
    exported, setting, value, message
):
    settings = {name: [value, value] for name, value in NEUTRAL.items()}
    settings["max_length"] = [0, 5]
    settings[setting] = [settings[setting][0], value]
    tensors = {name: tf.constant(v, CONTROLS[name][0]) for name, v in settings.items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{message}(.|\\n)*\\[1\\]"):
        exported[0].signatures()["controlled"](inputs=tf.constant(["4:08 PM", "12.5%"]), **tensors)


def test_translate_command_controls_are_the_controlled_signatures(exported, tmp_path, capsys):
    translator, _, _, path = exported
    inputs = ["Monday, March 3, 2014", "4:08 PM", "", "12.5%", LONG]
    write_lines(tmp_path / "in.en", [line.encode() for line in inputs])
    (tmp_path / "banned.txt").write_text("March\n\n  4:08 PM  \n", encoding="utf-8")
    flags = ["--no-repeat-ngram-size", "2", "--repetition-penalty", "1.3", "--min-length", "2",
             "--max-output-length", "20", "--disable-unk",
             "--banned-words", str(tmp_path / "banned.txt")]  # fmt: skip
    argv = ["--model", path, "--input", str(tmp_path / "in.en"), "--batch-size", "2", *flags]
    assert translate_command.main(argv) == 0
    written = capsys.readouterr().out.splitlines()
    rows = len(inputs)
    controls = {
        "no_repeat_ngram_size": tf.fill([rows], 2), "repetition_penalty": tf.fill([rows], 1.3),
        "min_length": tf.fill([rows], 2), "max_length": tf.fill([rows], 20),
        "disable_unk": tf.fill([rows], True), "banned_words": tf.fill([rows], "March\n4:08 PM"),
    }  # fmt: skip
    expected = translator.signatures()["controlled"](inputs=tf.constant(inputs), **controls)
    assert written == [t.decode("utf-8") for t in expected["translations"].numpy()]
    plain = translator.signatures()["serving_default"](inputs=tf.constant(inputs))
    assert written != [t.decode("utf-8") for t in plain["translations"].numpy()]


def test_prefix_signature_refuses_a_prefix_longer_than_the_output_limit(exported):
    signature = exported[0].signatures()["prefix"]
    long_prefix = " ".join(["12.5%"] * 30)  # far more pieces than 3 + 50
    with pytest.raises(tf.errors.InvalidArgumentError, match="more pieces than"):
        signature(inputs=tf.constant(["4:08 PM", "ok"]), prefixes=tf.constant(["", long_prefix]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one prefixes row per input"):
        signature(inputs=tf.constant(["4:08 PM", "ok"]), prefixes=tf.constant([""]))


def test_eight_threads_get_the_sequential_results(served):
    assert served["threads_equal_sequential"] is True


def test_saved_model_cli_runs_the_export(exported, served):
    _, _, _, path = exported
    show = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "show", "--all",
         "--dir", path],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert show.returncode == 0, show.stderr[-2000:]
    for signature in ("serving_default", "nbest", "translate"):
        assert f"signature_def['{signature}']" in show.stdout
    # saved_model_cli does not load tensorflow-text's ops itself; README shows this form.
    launcher = (
        "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
        "sys.argv[0] = 'saved_model_cli'; sys.exit(saved_model_cli.main())"
    )
    run = subprocess.run(
        [sys.executable, "-c", launcher, "run", "--dir", path, "--tag_set", "serve",
         "--signature_def", "serving_default", "--input_exprs", 'inputs=["4:08 PM", "12.5%"]'],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout[run.stdout.index("output key translations") :]
    for text in (served["translations"][1], served["translations"][6]):
        assert repr(text.encode())[2:-1] in printed


def graph_ops(path):
    meta = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        meta.ParseFromString(handle.read())
    graph = meta.meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops - {function.signature.name for function in graph.library.function}


def read_ops(name):
    with open(os.path.join(HERE, "ops", name), encoding="utf-8") as handle:
        return {line.strip() for line in handle if line.strip() and line[0] != "#"}


def test_graph_uses_only_ops_tf_serving_2_20_registers(exported):
    """TF Serving 2.20: TensorFlow 2.20 with tensorflow-text 2.20.0 linked in."""
    tf_text_ops = read_ops("tf_text_2.20.0_ops.txt")
    ops = graph_ops(exported[3])
    custom = {op for op in ops if not hasattr(tf.raw_ops, op)}
    assert "SentencepieceOp" in custom  # the check sees the tokenizer's ops
    assert custom <= tf_text_ops, f"not in tensorflow-text 2.20.0: {custom - tf_text_ops}"
    missing = ops - tf_text_ops - read_ops("tensorflow_2.20.0_ops.txt")
    assert not missing, f"not in TensorFlow 2.20: {missing}"
    # XLA ops run in TF Serving only with XLA compilation switched on.
    assert not {op for op in ops if op.startswith("Xla")}


def test_the_space_estimate_bounds_the_export_from_above(exported):
    translator, _, _, path = exported
    size = sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )
    assert size <= translator.estimated_bytes() <= 3 * size


def test_a_full_disk_is_one_error_naming_the_folder_and_the_space(exported, tmp_path, monkeypatch):
    translator = exported[0]
    base = str(tmp_path / "models" / "full")
    import pipelines.serving.saved_model as saved_model

    def full(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(saved_model.tf.saved_model, "save", full)  # fills up while writing
    with pytest.raises(ExportError, match=f"^{base}: the disk filled up: the export needs about"):
        export(translator, base)
    assert os.listdir(base) == []  # no version, no staging
    usage = saved_model.shutil.disk_usage(str(tmp_path))
    small = usage._replace(free=translator.estimated_bytes() - 1)
    monkeypatch.setattr(saved_model.shutil, "disk_usage", lambda path: small)
    needed = translator.estimated_bytes() / 2**20
    with pytest.raises(
        ExportError, match=f"not enough space: the export needs about {needed:.0f} MiB"
    ):
        export(translator, str(tmp_path / "models" / "small"))
    assert not os.path.exists(tmp_path / "models" / "small")  # refused before writing


def test_versions_count_up_and_are_never_overwritten(exported, tmp_path):
    translator = exported[0]
    base = str(tmp_path / "model")
    assert next_version(base) == 1
    os.makedirs(os.path.join(base, "3"))
    assert export(translator, base).endswith(os.path.join("model", "4"))
    with pytest.raises(ExportError, match="already exists"):
        export(translator, base, version=4)
    assert sorted(os.listdir(base)) == ["3", "4"]


def test_command_errors_name_the_missing_file(tmp_path, capsys):
    assert export_command.main(["--run-dir", str(tmp_path), "--base", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model not found") and str(tmp_path) in err


def test_translate_command_writes_the_signatures_translations_in_order(exported, served, tmp_path):
    path = exported[3]
    lines = [text for text in INPUTS if b"\n" not in text]
    (tmp_path / "input.txt").write_bytes(b"".join(text + b"\n" for text in lines))
    output = tmp_path / "output.txt"
    command = [sys.executable, "-m", "pipelines", "translate", "--model", os.path.dirname(path),
               "--input", str(tmp_path / "input.txt"), "--output", str(output),
               "--batch-size", "2"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == served["translations"]
    assert f"translated {len(lines)}/{len(lines)} sentences" in result.stderr

    missing = [sys.executable, "-m", "pipelines", "translate", "--model", str(tmp_path / "none")]
    result = subprocess.run(missing, capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 2 and "error: --model: no such folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_large_request_returns_what_small_requests_return(exported):
    """1,000 sentences in one request, sorted and chunked in the graph, against 16 requests."""
    from pipelines.data.default_corpus import generate_pairs
    from pipelines.serving.translation import translate_strings

    translator, model, _, _ = exported

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(batch):
        return translate_strings(
            model, translator.tokenizer, batch, beam_size=4, alpha=0.6,
            max_source_length=MAX_SOURCE_LENGTH, chunk_size=64,
        )  # fmt: skip

    sentences = [source for source, _ in generate_pairs(1000, seed=3)]
    texts, scores = serve(tf.constant(sentences))
    parts = [serve(tf.constant(sentences[i : i + 64])) for i in range(0, 1000, 64)]
    assert len(parts) == 16
    np.testing.assert_array_equal(texts.numpy(), np.concatenate([p[0].numpy() for p in parts]))
    # Matrix products of other row counts round differently in the last bits.
    np.testing.assert_allclose(
        scores.numpy(), np.concatenate([p[1].numpy() for p in parts]), rtol=1e-5
    )
    assert len(set(texts.numpy()[:, 0])) > 100  # distinct translations, not one repeated


def test_score_command_writes_the_signatures_scores_line_by_line(exported, tmp_path, capsys):
    from pipelines import cli

    path = exported[3]
    sources = ["Monday, March 3, 2014", "4:08 PM", "12.5%"]
    targets = ["Montag, 3. März 2014", "16:08", "12,5 %"]
    (tmp_path / "src").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    output = tmp_path / "scores.txt"
    argv = ["score", "--model", os.path.dirname(path), "--source", str(tmp_path / "src"),
            "--target", str(tmp_path / "tgt"), "--batch-size", "2", "--lengths"]  # fmt: skip
    assert cli.main(argv + ["--output", str(output)]) == 0
    expected = tf.saved_model.load(path).signatures["score"](
        sources=tf.constant(sources), targets=tf.constant(targets)
    )
    rows = [line.split("\t") for line in output.read_text().splitlines()]
    np.testing.assert_allclose([float(s) for s, _ in rows], expected["scores"].numpy(), atol=1e-5)
    assert [int(n) for _, n in rows] == list(expected["lengths"].numpy())
    (tmp_path / "short").write_text("one line\n")
    argv[argv.index(str(tmp_path / "tgt"))] = str(tmp_path / "short")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --source {tmp_path}/src has 3 lines but --target {tmp_path}/short has 1"
    )


def test_the_export_carries_warm_up_requests_for_every_signature(exported):
    """TF Serving replays assets.extra/tf_serving_warmup_requests; each must run."""
    path = exported[3]
    requests = read_warmup_requests(path)
    signatures = tf.saved_model.load(path).signatures
    names = [request.model_spec.signature_name for request in requests]
    assert sorted(set(names)) == sorted(signatures) and names.count("translate") == 4
    assert names.count("sample") == 4 and names.count("controlled") == 4
    for request in requests:
        signature = signatures[request.model_spec.signature_name]
        inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
        outputs = signature(**inputs)
        rows = int(tf.shape(inputs.get("inputs", inputs.get("sources")))[0])
        assert rows > 1
        assert all(int(tf.shape(value)[0]) == rows for value in outputs.values())


def test_an_export_for_the_batcher_warms_up_only_what_the_batcher_accepts(exported, tmp_path):
    """TF Serving replays warm-up through the batcher (`--enable_batching`); a refusal fails it."""
    _, model, spm_path, path = exported
    scalar = tf.make_tensor_proto(4, tf.int32)
    rows = tf.make_tensor_proto(["a", "b"], tf.string)
    assert batcher_accepts({"inputs": rows, "top_k": tf.make_tensor_proto([1, 2], tf.int32)})
    assert not batcher_accepts({"inputs": rows, "beam_size": scalar})
    assert not batcher_accepts({"inputs": rows, "top_k": tf.make_tensor_proto([1], tf.int32)})
    default = read_warmup_requests(path)
    refused = {r.model_spec.signature_name for r in default if not batcher_accepts(r.inputs)}
    assert refused == {"translate", "controlled_search"}
    run = tmp_path / "run"
    run.mkdir()
    model.save(run / "model.keras")
    shutil.copy(spm_path, run / "sentencepiece.model")
    argv = ["--run-dir", str(run), "--max-source-length", str(MAX_SOURCE_LENGTH),
            "--base", str(tmp_path), "--name", "batched", "--batching"]  # fmt: skip
    assert export_command.main(argv) == 0
    batched = read_warmup_requests(str(tmp_path / "batched" / "1"))
    # The default's requests, those with scalars left out, byte for byte.
    kept = [r for r in default if r.model_spec.signature_name not in refused]
    assert [r.SerializeToString() for r in batched] == [r.SerializeToString() for r in kept]
    assert len(kept) == len(default) - 12  # 2 batches, beam 1 and 4; controls off and on
    # Recorded, so that an operator tells the two kinds apart from the export alone.
    assert export_settings(str(tmp_path / "batched" / "1"))["batching"] is True
    argv = [*argv[: argv.index("batched")], "plain", "--signatures", "serving_default", "score"]
    assert export_command.main(argv) == 0
    assert export_settings(str(tmp_path / "plain" / "1"))["batching"] is False
    # The docs' in-place rewrite of an export's warm-up: its record follows, and the requests
    # are those of the signatures it holds.
    write_warmup_requests(str(tmp_path / "plain" / "1"), batching=True)
    assert export_settings(str(tmp_path / "plain" / "1"))["batching"] is True
    assert read_warmup_requests(str(tmp_path / "plain" / "1"))[0].SerializeToString() == (
        batched[0].SerializeToString()
    )


def test_an_export_of_some_signatures_holds_and_warms_up_those_alone(exported, tmp_path, capsys):
    full, model, spm_path, full_path = exported
    with pytest.raises(ValueError, match="Received: nbest_of_all, sampling"):
        Translator(model, spm_path, MAX_SOURCE_LENGTH, signatures=["sampling", "nbest_of_all"])
    translator = Translator(
        model, spm_path, MAX_SOURCE_LENGTH, beam_size=4, alpha=0.6, num_hypotheses=3,
        chunk_size=3, signatures=["score", "serving_default"],
    )  # fmt: skip
    assert translator.estimated_bytes() < full.estimated_bytes()
    path = export(translator, str(tmp_path / "some"))
    assert export_settings(path)["signatures"] == ["serving_default", "score"]
    assert export_settings(full_path)["signatures"] == list(SIGNATURES)
    loaded = tf.saved_model.load(path).signatures
    assert sorted(loaded) == ["score", "serving_default"]
    warmed = [request.model_spec.signature_name for request in read_warmup_requests(path)]
    assert sorted(set(warmed)) == ["score", "serving_default"] and len(warmed) == 4
    inputs = tf.constant(INPUTS)
    served = tf.saved_model.load(full_path).signatures["serving_default"](inputs=inputs)
    ours = loaded["serving_default"](inputs=inputs)
    assert ours["translations"].numpy().tolist() == served["translations"].numpy().tolist()
    np.testing.assert_allclose(ours["scores"].numpy(), served["scores"].numpy(), rtol=1e-5)
    # A request for a signature it lacks names the flag that left it out.
    source = tmp_path / "source"
    source.write_text("4:08 PM\n")
    argv = ["--model", path, "--input", str(source), "--beam-size", "2"]
    assert translate_command.main(argv) == 2
    error = capsys.readouterr().err
    assert "has no translate signature" in error and "(--signatures)" in error
    argv = ["--run-dir", "unused", "--signatures", "serving_default", "sample_all"]
    with pytest.raises(SystemExit):
        export_command.main(argv)
    assert "invalid choice: 'sample_all'" in capsys.readouterr().err


def test_word_alignments_join_pieces_into_words():
    from pipelines.serving.client import word_alignments

    source = ["\u2581A", "\u2581dog", "s", "\u2581run", "", ""]
    target = ["\u2581Hund", "e", "\u2581laufen", ""]
    assert word_alignments(source, target, [1, 2, 3, -1]) == "1-0 2-1"
    assert word_alignments(source, target, [-1, -1, 0, -1]) == "0-1"
    assert word_alignments([""], [""], [-1]) == ""


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def test_translate_command_keeps_the_exports_setting_of_the_flag_not_given(
    exported, tmp_path, monkeypatch
):

    from pipelines import cli
    from pipelines.serving import client

    version = tmp_path / "other" / "1"
    shutil.copytree(exported[3], version)
    settings_path = version / client.SETTINGS_FILE
    settings = json.loads(settings_path.read_text())
    settings.update(beam_size=3, alpha=0.25)  # an export made with other search settings
    settings_path.write_text(json.dumps(settings))
    source = write_lines(tmp_path / "in.txt", [b"4:08 PM", b"12.5%"])
    calls, call_in_batches = [], client.call_in_batches

    def recorded(signature, lines, batch_size=1024, rows=None, scalars=None):
        values = {name: value.numpy() for name, value in (scalars or {}).items()}
        calls.append({name: getattr(v, "item", lambda v=v: v)() for name, v in values.items()})
        return call_in_batches(signature, lines, batch_size, rows, scalars)

    monkeypatch.setattr(client, "call_in_batches", recorded)
    argv = ["translate", "--model", str(version), "--input", source]
    assert cli.main(argv + ["--alpha", "1.0", "--output", str(tmp_path / "a.txt")]) == 0
    assert calls == [{"beam_size": 3, "alpha": 1.0, "penalty_form": b""}]
    assert cli.main(argv + ["--beam-size", "2", "--output", str(tmp_path / "b.txt")]) == 0
    assert calls[1] == {"beam_size": 2, "alpha": 0.25, "penalty_form": b""}
    assert cli.main(argv + ["--penalty-form", "power", "--output", str(tmp_path / "c.txt")]) == 0
    assert calls[2] == {"beam_size": 3, "alpha": 0.25, "penalty_form": b"power"}
    assert cli.main(argv + ["--alpha", "-0.5"]) == 2
    assert len(calls) == 3  # refused before any translation


def test_translate_command_prefixes_and_alignments_are_the_signatures(
    exported, served, tmp_path, capsys
):
    from pipelines import cli
    from pipelines.serving.client import word_alignments

    model = os.path.dirname(exported[3])
    source = write_lines(tmp_path / "in.txt", INPUTS)
    prefixes = write_lines(tmp_path / "prefixes.txt", [p.encode() for p in served["prefixes"]])
    output, alignments = tmp_path / "out.txt", tmp_path / "align.txt"
    argv = ["translate", "--model", model, "--input", source, "--prefix-file", prefixes,
            "--batch-size", "3"]  # fmt: skip
    assert cli.main(argv + ["--output", str(output), "--alignments", str(alignments)]) == 0
    assert output.read_text(encoding="utf-8").splitlines() == served["prefixed"]
    aligned = served["aligned"]
    expected = [
        word_alignments(*rows)
        for rows in zip(
            aligned["source_pieces"], aligned["target_pieces"], aligned["alignments"], strict=True
        )
    ]
    assert alignments.read_text().split("\n")[:-1] == expected
    assert sum(bool(line) for line in expected) >= 4  # pairs for every real sentence
    for line in expected:
        for pair in line.split():
            i, j = map(int, pair.split("-"))
            assert i >= 0 and j >= 0

    capsys.readouterr()
    short = write_lines(tmp_path / "short.txt", [b"x"])
    argv[argv.index(prefixes)] = short
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --prefix-file {short} has 1 lines but --input {source} has {len(INPUTS)}"
    )
    long_prefix = write_lines(tmp_path / "long.txt", [b""] * 6 + [b" ".join([b"12.5%"] * 30)])
    argv[argv.index(short)] = long_prefix
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --prefix-file {long_prefix}, line 7: the prefix has ")
    limit = len(exported[0].tokenizer.tokenize("12.5%").numpy()) + 1 + 50
    assert f"more than the {limit} its sentence may produce" in err
    # A source longer than the export keeps: the limit counts the pieces it keeps.
    pieces = lambda text: len(exported[0].tokenizer.tokenize(text).numpy())  # noqa: E731
    assert pieces(LONG) + 1 > MAX_SOURCE_LENGTH
    words = 1
    while pieces(" ".join(["kilometers"] * words)) <= MAX_SOURCE_LENGTH + 50:
        words += 1
    prefix = " ".join(["kilometers"] * words).encode()
    assert pieces(prefix) <= pieces(LONG) + 1 + 50  # within the limit of the uncut source
    cut_prefix = write_lines(tmp_path / "cut.txt", [b""] * 4 + [prefix] + [b""] * 2)
    argv[argv.index(long_prefix)] = cut_prefix
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --prefix-file {cut_prefix}, line 5: the prefix has ")
    assert f"more than the {MAX_SOURCE_LENGTH + 50} its sentence may produce" in err
    assert f"cut at {MAX_SOURCE_LENGTH}" in err


def test_translate_command_samples_reproducibly(exported, served, tmp_path):
    from pipelines import cli

    model = os.path.dirname(exported[3])
    source = write_lines(tmp_path / "in.txt", INPUTS)
    base = ["translate", "--model", model, "--input", source]

    def sample(name, *flags):
        assert cli.main(base + ["--output", str(tmp_path / name), *flags]) == 0
        return (tmp_path / name).read_text(encoding="utf-8").split("\n")[:-1]

    top_1 = sample("top1.txt", "--sampling-topk", "1", "--num-samples", "2")
    assert top_1 == [text for text in served["greedy"] for _ in range(2)]
    first = sample("a.txt", "--sampling-temperature", "2", "--num-samples", "3", "--seed", "4")
    again = sample("b.txt", "--sampling-temperature", "2", "--num-samples", "3", "--seed", "4",
                   "--batch-size", "4")  # fmt: skip
    other = sample("c.txt", "--sampling-temperature", "2", "--num-samples", "3", "--seed", "5")
    assert len(first) == 3 * len(INPUTS) and first == again and first != other
    assert len(set(first[:3])) == 3  # a line's samples differ from each other


def test_translate_command_combines_controls_with_a_beam_size_prefixes_and_sampling(
    exported, tmp_path, capsys
):
    translator, _, _, path = exported
    signatures = translator.signatures()
    inputs = [b"Monday, March 3, 2014", b"4:08 PM", b"", b"12.5%"]
    prefixes = [b"", b"March", b"", b"kilometers"]
    source = write_lines(tmp_path / "in.en", inputs)
    prefix_file = write_lines(tmp_path / "prefixes.txt", prefixes)
    rows = len(inputs)
    controls = {
        **{name: tf.fill([rows], NEUTRAL[name]) for name in CONTROLS},
        "no_repeat_ngram_size": tf.fill([rows], 2), "disable_unk": tf.fill([rows], True),
    }  # fmt: skip
    base = ["--model", path, "--input", source, "--no-repeat-ngram-size", "2", "--disable-unk"]

    def written(*flags):
        assert translate_command.main([*base, *flags]) == 0
        return capsys.readouterr().out.splitlines()

    searched = written("--beam-size", "2", "--alpha", "1.0", "--prefix-file", prefix_file)
    expected = signatures["controlled_search"](
        inputs=tf.constant(inputs), prefixes=tf.constant(prefixes), beam_size=tf.constant(2),
        alpha=tf.constant(1.0), penalty_form=tf.constant(""), **controls,
    )  # fmt: skip
    assert searched == [t.decode("utf-8") for t in expected["translations"].numpy()]
    assert searched[1].startswith("March")
    # Top-1 samples with the same prefixes and controls: greedy search with them, twice a line.
    sampled = written("--sampling-topk", "1", "--num-samples", "2", "--prefix-file", prefix_file)
    greedy = signatures["controlled_search"](
        inputs=tf.constant(inputs), prefixes=tf.constant(prefixes), beam_size=tf.constant(1),
        alpha=tf.constant(0.0), penalty_form=tf.constant(""), **controls,
    )  # fmt: skip
    assert sampled == [t.decode("utf-8") for t in greedy["translations"].numpy() for _ in (0, 1)]


def test_the_grpc_requests_of_the_docs_fit_every_signature(exported):
    """docs/tf-serving.md's requests: one per signature, each input in the signature's dtype."""
    page = os.path.join(HERE, "..", "..", "..", "docs", "tf-serving.md")
    text = open(page, encoding="utf-8").read()
    block = text.split("<!-- grpc-requests -->\n```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(block, namespace)  # noqa: S102  the page's own code
    requests = namespace["requests"]
    signatures = tf.saved_model.load(exported[3]).signatures
    assert set(requests) == set(signatures.keys())
    for name, inputs in requests.items():
        expected = signatures[name].structured_input_signature[1]
        assert set(inputs) == set(expected), name
        # As TF Serving does: each proto becomes a tensor of its dtype, fed by name.
        tensors = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in inputs.items()}
        for key, tensor in tensors.items():
            assert tensor.dtype == expected[key].dtype, (name, key)
            assert expected[key].shape.is_compatible_with(tensor.shape), (name, key)
        outputs = signatures[name](**tensors)
        assert all(value.shape[0] == 2 for value in outputs.values()), name  # two sentences
