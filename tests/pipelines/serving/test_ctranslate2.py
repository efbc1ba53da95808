"""CTranslate2 export: converted weights score and translate as the Keras model does."""

import json
import os

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from keras_transformer import beam_search, greedy_search
from pipelines.commands import ctranslate2_export, train
from pipelines.data.corpus import read_lines
from pipelines.data.tokenizer import EOS_ID, load_tokenizer
from pipelines.serving.ctranslate2 import CTranslate2Translator, convert
from pipelines.serving.translation import decode, encode
from tests.pipelines.conftest import shared_data, tiny_translation_model
from tests.test_case import to_numpy

ctranslate2 = pytest.importorskip("ctranslate2")

# One worker runs the module, so its module fixtures are built once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("ctranslate2")

SENTENCES = ["Monday, March 3, 2014", "4:08 PM", "12.5%", "1,234.5 kilometers"]


def keras_log_probs(model, processor, sources, targets):
    """Per-token log p(target token | prefix, source) from the Keras model."""
    rows = []
    for source, target in zip(sources, targets, strict=True):
        source_ids = np.array([processor.encode(source) + [EOS_ID]], "int32")
        target_ids = processor.encode(target)
        target_in = np.array([[model.bos_id, *target_ids]], "int32")
        logits = np.asarray(model((source_ids, target_in)))[0].astype("float64")
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.sum(np.exp(shifted), -1, keepdims=True))
        rows.append(log_probs[np.arange(len(target_ids) + 1), [*target_ids, EOS_ID]])
    return rows


@pytest.mark.parametrize(
    "architecture",
    [
        {},
        {"normalize_first": True},
        {"tie_output_embeddings": False, "learned_positions": True, "max_positions": 64},
        {"activation": "gelu", "num_heads": 4},
        {"activation": "swish", "sinusoid_layout": "concatenated", "output_bias": True},
    ],
    ids=["paper", "pre-norm", "untied-learned-positions", "gelu", "marian"],
)
def test_converted_model_scores_every_token_as_keras_does(tmp_path, architecture):
    arguments = {"num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64, "num_heads": 2}
    model, spm_path = tiny_translation_model(tmp_path, 150, **{**arguments, **architecture})
    if model.logits_bias is not None:
        model.logits_bias.assign(np.random.default_rng(0).normal(size=150).astype("float32"))
    path = convert(model, spm_path, str(tmp_path / "ct2"), max_source_length=32)
    processor = spm.SentencePieceProcessor(model_file=spm_path)
    targets = ["Montag, 3. März 2014", "16:08", "12,5 %", "1.234,5 Kilometer"]
    translator = ctranslate2.Translator(path, device="cpu")
    scored = translator.score_batch(
        processor.encode(SENTENCES, out_type=str), processor.encode(targets, out_type=str)
    )
    expected = keras_log_probs(model, processor, SENTENCES, targets)
    for result, log_probs in zip(scored, expected, strict=True):
        np.testing.assert_allclose(result.log_probs, log_probs, atol=2e-4)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A small model trained on the default corpus (about 40 s on 2 cores)."""
    run = tmp_path_factory.mktemp("ct2") / "run"
    settings = {
        "default_corpus_sizes": "[4000,100,200]",
        "model.num_layers": "2",
        "model.hidden_dim": "64",
        "model.intermediate_dim": "128",
        "batch_tokens": "1024",
        "vocabulary_size": "300",
        "steps": "300",
        "steps_per_epoch": "100",
        "warmup_steps": "100",
        "average_last": "1",
    }
    argv = ["--output-dir", str(run)]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    assert train.main(argv) == 0
    return run


def test_trained_model_translates_the_same_in_ctranslate2(trained_run, tmp_path, capsys):
    run = str(trained_run)
    assert ctranslate2_export.main(["--run-dir", run, "--output", str(tmp_path / "ct2")]) == 0
    path = capsys.readouterr().out.strip()
    with open(f"{run}/result.json", encoding="utf-8") as handle:
        assert json.load(handle)["greedy_bleu"] > 30  # trained, not a random model
    sources = read_lines(f"{run}/heldout.source")
    import keras

    model = keras.saving.load_model(f"{run}/model.keras")
    tokenizer = load_tokenizer(f"{run}/sentencepiece.model")
    max_length = json.load(open(f"{run}/config.json"))["batching"]["max_length"]
    source_ids = encode(tokenizer, tf.constant(sources), EOS_ID, max_length).to_tensor()
    translator = CTranslate2Translator(path)
    # With no length penalty both beam searches maximise the same score.
    greedy = greedy_search(model, source_ids, return_scores=True)
    beam = beam_search(model, source_ids, beam_size=4, alpha=0.0)
    for beam_size, (tokens, scores) in ((1, greedy), (4, (beam[0][:, 0], beam[1][:, 0]))):
        ours = [t.decode() for t in decode(tokenizer, tokens, EOS_ID).numpy()]
        theirs, their_scores, _ = translator.translate(sources, beam_size, length_penalty=0.0)
        same = [a == b for a, b in zip(ours, theirs, strict=True)]
        assert np.mean(same) >= 0.95, (beam_size, np.mean(same))
        # Two engines' float32 arithmetic on a weakly trained model: a sentence's
        # log-probability differed by up to 8e-3 (per-token agreement on random
        # models is tested above at 2e-4).
        np.testing.assert_allclose(
            np.array(their_scores)[same], np.asarray(scores)[same], rtol=1e-3, atol=1e-2
        )
    # Two batches translated at once, one thread each: the same translations, in input order.
    at_once = CTranslate2Translator(path, threads=1, inter_threads=2)
    assert at_once.translator.num_translators == 2 and translator.translator.num_translators == 1
    expected = translator.translate(sources, 4, batch_size=4)[0]
    assert at_once.translate(sources, 4, batch_size=4)[0] == expected


def test_export_command_refuses_to_overwrite_and_names_missing_files(trained_run, tmp_path, capsys):
    output = str(tmp_path / "ct2")
    argv = ["--run-dir", str(trained_run), "--output", output]
    assert ctranslate2_export.main(argv) == 0
    assert ctranslate2_export.main(argv) == 2
    assert "exists" in capsys.readouterr().err
    assert ctranslate2_export.main([*argv, "--force"]) == 0
    translator = CTranslate2Translator(output)
    translations, scores, lengths = translator.translate(["4:08 PM", "12.5%"], beam_size=2)
    assert len(translations) == 2 and all(length > 0 for length in lengths)
    missing = ["--run-dir", str(tmp_path / "nothing"), "--output", str(tmp_path / "x")]
    assert ctranslate2_export.main(missing) == 2
    assert "model not found" in capsys.readouterr().err


@pytest.fixture(scope="module")
def converted_run(trained_run, tmp_path_factory):
    """The trained run's model, its `<unk>` made likely, and its CTranslate2 conversion.

    `<unk>`'s embedding becomes 1.1 times that of the token the model produces
    most, so that `<unk>` wins where that token would and `disable_unk` bites.

    Returns:
        `(model, CTranslate2 folder)`.
    """
    import keras

    run = str(trained_run)
    model = keras.saving.load_model(f"{run}/model.keras")
    max_length = json.load(open(f"{run}/config.json"))["batching"]["max_length"]
    tokenizer = load_tokenizer(f"{run}/sentencepiece.model")
    sources = read_lines(f"{run}/heldout.source")
    source_ids = encode(tokenizer, tf.constant(sources), EOS_ID, max_length).to_tensor()
    produced = to_numpy(greedy_search(model, source_ids)).reshape(-1)
    common = np.bincount(produced[produced > EOS_ID]).argmax()
    table = model.source_embedding.embeddings
    table.assign(tf.tensor_scatter_nd_update(table, [[model.unk_id]], [1.1 * table[common]]))
    path = str(tmp_path_factory.mktemp("ct2-controls") / "ct2")
    convert(model, f"{run}/sentencepiece.model", path, max_source_length=max_length)
    return model, path


@pytest.mark.parametrize(
    "controls",
    [
        {"no_repeat_ngram_size": 2},
        {"repetition_penalty": 1.5},
        {"min_length": 12},
        {"disable_unk": True},
        {
            "no_repeat_ngram_size": 3,
            "repetition_penalty": 1.2,
            "min_length": 8,
            "disable_unk": True,
        },
    ],
    ids=["no-repeat-ngram", "repetition-penalty", "min-length", "disable-unk", "all"],
)
def test_greedy_controls_equal_ctranslate2s_token_for_token(converted_run, controls):
    """On Multi30k's test sentences, out of the model's domain: outputs that repeat themselves."""
    model, path = converted_run
    sources = read_lines(os.path.join(shared_data("multi30k"), "test_2016_flickr.en.gz"))
    translator = CTranslate2Translator(path)
    pieces = [
        p[: translator.max_source_length - 1]
        for p in translator.processor.encode(sources, out_type=str)
    ]
    source_ids = tf.ragged.constant(
        [translator.processor.piece_to_id(p) + [EOS_ID] for p in pieces], dtype=tf.int32
    ).to_tensor()
    limit = 40  # well under every sentence's own limit (its length + 50)
    ours = to_numpy(greedy_search(model, source_ids, controls={**controls, "max_length": limit}))
    theirs = translator.translator.translate_batch(
        pieces,
        beam_size=1,
        max_batch_size=64,
        max_decoding_length=limit,
        no_repeat_ngram_size=controls.get("no_repeat_ngram_size", 0),
        repetition_penalty=controls.get("repetition_penalty", 1.0),
        min_decoding_length=controls.get("min_length", 0),
        disable_unk=controls.get("disable_unk", False),
    )
    plain = to_numpy(greedy_search(model, source_ids, controls={"max_length": limit}))
    ours_pieces = [
        [translator.target_processor.id_to_piece(int(t)) for t in row if t not in (0, EOS_ID)]
        for row in ours
    ]
    same = [a == b.hypotheses[0] for a, b in zip(ours_pieces, theirs, strict=True)]
    assert np.mean(same) == 1.0, [i for i, s in enumerate(same) if not s][:5]
    assert np.mean(np.any(ours != plain, axis=1)) > 0.1  # the controls changed outputs


def multi30k_test_ids(translator):
    """Multi30k's test sentences as CTranslate2 cuts them: `(sources, source_ids (B, S))`."""
    sources = read_lines(os.path.join(shared_data("multi30k"), "test_2016_flickr.en.gz"))
    pieces = [p[: translator.max_source_length - 1] for p in translator.source_pieces(sources)]
    source_ids = tf.ragged.constant(
        [translator.processor.piece_to_id(p) + [EOS_ID] for p in pieces], dtype=tf.int32
    ).to_tensor()
    return sources, source_ids


@pytest.mark.parametrize("arm", ["controls", "banned-sequences", "prefix-and-controls"])
def test_beam_search_with_controls_equals_ctranslate2s(converted_run, arm):
    """Beam 4 under controls, banned sequences (`suppress_sequences`) and prefixes: the same
    hypotheses as CTranslate2's `translate_batch`, scored with its `length ** alpha` form. With a
    length penalty CTranslate2 stops a sentence once `beam_size` hypotheses have finished, which
    the default rule is closer to than `early_stop` (its rule without one)."""
    model, path = converted_run
    translator = CTranslate2Translator(path)
    sources, source_ids = multi30k_test_ids(translator)
    target = translator.target_processor
    search = {"beam_size": 4, "alpha": 0.6, "penalty_form": "power"}
    limit = 40
    plain = to_numpy(beam_search(model, source_ids, controls={"max_length": limit}, **search)[0])
    controls, prefixes = {"max_length": limit}, None
    if arm in ("controls", "prefix-and-controls"):
        controls.update(no_repeat_ngram_size=3, repetition_penalty=1.2, min_length=8)
        controls.update(disable_unk=True)
    if arm == "banned-sequences":
        produced = plain[:, 0][(plain[:, 0] > EOS_ID)]
        common = np.bincount(produced).argsort()[::-1]  # the model's favourite tokens
        pairs = [tuple(row[i : i + 2]) for row in plain[:, 0] for i in range(len(row) - 1)]
        pairs = [p for p in pairs if min(p) > EOS_ID]
        bigram = max(set(pairs), key=pairs.count)
        controls["banned_tokens"] = [int(common[0]), [int(t) for t in bigram], [int(common[1])] * 2]
    if arm == "prefix-and-controls":
        # Every third sentence starts with the first two tokens of its output without `<unk>`
        # (this model's favourite, which would come back as the text " ⁇ ").
        free = {"max_length": limit, "disable_unk": True}
        known = to_numpy(beam_search(model, source_ids, controls=free, **search)[0])[:, 0]
        prefixes = ["" if i % 3 else target.decode_ids([int(t) for t in row[:2]])
                    for i, row in enumerate(known)]  # fmt: skip
        prefix_ids = tf.ragged.constant([target.encode(p) for p in prefixes], tf.int32)
        search["target_prefix"] = prefix_ids.to_tensor(0, shape=[None, 8])
    ours = to_numpy(beam_search(model, source_ids, controls=controls, **search)[0])[:, 0]
    theirs, _, _ = translator.translate(
        sources, beam_size=4, length_penalty=search["alpha"], controls=controls, prefixes=prefixes
    )
    texts = [target.decode_ids([int(t) for t in row if t not in (0, EOS_ID)]) for row in ours]
    same = [a == b for a, b in zip(texts, theirs, strict=True)]
    assert np.mean(same) >= 0.98, (np.mean(same), [i for i, s in enumerate(same) if not s][:5])
    assert np.mean(np.any(ours != plain[:, 0], axis=1)) > 0.1  # the controls changed outputs
