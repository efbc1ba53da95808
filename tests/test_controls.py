"""Decoding controls: each rule against NumPy, in every search, with prefixes and per-row values."""

import keras
import numpy as np
import pytest

from keras_transformer import beam_search, greedy_search, length_penalty, sample
from keras_transformer.decoding.controls import banned_sequences
from tests.test_case import random_transformer, to_numpy
from tests.test_decoding import EOS, EXTRA, PAD, SOURCES, VOCABULARY, model  # noqa: F401

BOS = 2


@pytest.fixture(scope="module")
def ending_model():
    """A model whose greedy outputs end at once: the end token is its first choice."""
    return random_transformer(SOURCES, VOCABULARY, num_layers=2, seed=11)


def numpy_cut(logits, output, controls, unk_id):
    """The controls' rules on one row's float64 logits `(V,)`, written out plainly."""
    logits = logits.copy()
    penalty = controls.get("repetition_penalty", 1.0)
    for token in set(output):
        logits[token] = logits[token] * penalty if logits[token] < 0 else logits[token] / penalty
    banned = set()
    n = controls.get("no_repeat_ngram_size", 0)
    if n and len(output) >= n:
        pattern = output[len(output) - n + 1 :]
        for start in range(len(output) - n + 1):
            if output[start : start + n - 1] == pattern:
                banned.add(output[start + n - 1])
    if len(output) < controls.get("min_length", 0):
        banned.add(EOS)
    if controls.get("disable_unk"):
        banned.add(unk_id)
    for item in controls.get("banned_tokens", []):
        sequence = [item] if isinstance(item, int) else list(item)
        before = sequence[:-1]
        if not before or (
            len(output) >= len(before) and output[len(output) - len(before) :] == before
        ):
            banned.add(sequence[-1])
    logits[list(banned)] = -np.inf
    return logits


def numpy_log_softmax(logits):
    shifted = logits - np.max(logits)
    return shifted - np.log(np.sum(np.exp(shifted)))


def step_logits(model, source, output):  # noqa: F811
    """float64 `(V,)` logits of the token after `output`, from the whole model."""
    inputs = np.array([[BOS, *output]], "int32")
    return to_numpy(model((source[None], inputs)))[0, -1].astype("float64")


def reference_greedy(model, controls, prefix=None):  # noqa: F811
    """Greedy search of every sentence of SOURCES, token by token in NumPy."""
    outputs = []
    for row, source in enumerate(SOURCES):
        limit = int(np.sum(source != PAD)) + EXTRA
        if controls.get("max_length"):
            limit = min(limit, controls["max_length"])
        forced = [] if prefix is None else [t for t in prefix[row] if t != PAD]
        output = []
        while len(output) < limit and (not output or output[-1] != EOS):
            if len(output) < len(forced):
                output.append(forced[len(output)])
                continue
            logits = numpy_cut(step_logits(model, source, output), output, controls, model.unk_id)
            logits[[PAD, BOS]] = -np.inf
            output.append(int(np.argmax(logits)))
        outputs.append(output)
    return outputs


def rows(tokens):
    """Int `(B, T)` search output -> lists of tokens up to and with EOS."""
    return [[int(t) for t in row if t != PAD] for row in to_numpy(tokens)]


def plain_greedy(model):  # noqa: F811
    return rows(greedy_search(model, SOURCES, extra_length=EXTRA))


def controls_that_bite(model):  # noqa: F811
    """Settings of each control chosen from the model's own outputs, so that each changes them."""
    plain = plain_greedy(model)
    first = plain[0]
    return {
        "no_repeat_ngram_size=1": {"no_repeat_ngram_size": 1},
        "no_repeat_ngram_size=2": {"no_repeat_ngram_size": 2},
        "repetition_penalty=3": {"repetition_penalty": 3.0},
        "repetition_penalty=0.5": {"repetition_penalty": 0.5},
        "max_length": {"max_length": 4},
        "banned_tokens": {"banned_tokens": [first[0], first[1:3]]},
        "all": {
            "no_repeat_ngram_size": 2,
            "repetition_penalty": 1.5,
            "min_length": 6,
            "max_length": 12,
            "disable_unk": True,
            "banned_tokens": [[first[0], first[1]]],
        },  # fmt: skip
    }


CONTROLS = [
    "no_repeat_ngram_size=1", "no_repeat_ngram_size=2", "repetition_penalty=3",
    "repetition_penalty=0.5", "max_length", "banned_tokens", "all",
]  # fmt: skip


def search_options():
    dynamic = keras.backend.backend() != "jax"
    return [(True, None), (False, None)] + ([(True, False)] if dynamic else [(True, True)])


def test_apply_controls_cuts_each_row_as_the_rules_say(model):  # noqa: F811
    """Tokens produced twice, and positions not yet decoded holding -2, -1 or ids past V."""
    from keras_transformer.decoding.controls import apply_controls, check_controls
    from keras_transformer.decoding.steps import IMPOSSIBLE

    rng = np.random.default_rng(3)
    logits = (3 * rng.normal(size=(3, VOCABULARY))).astype("float32")
    index = 6
    history = np.array(
        [[4, 5, 4, 5, 4, 7, -2, 0, 15],
         [6, 6, 6, 8, 9, 6, 3, -1, 3],
         [10, 11, 10, 11, 10, 5, 99, -1, 4]], "int32",
    )  # fmt: skip
    rules = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "min_length": 8,
             "disable_unk": True, "banned_tokens": [7, [11, 10], [4, 12]]}  # fmt: skip
    cut = apply_controls(
        model,
        keras.ops.convert_to_tensor(logits),
        keras.ops.convert_to_tensor(history),
        keras.ops.convert_to_tensor(index, "int32"),
        keras.ops.arange(3, dtype="int32"),
        check_controls(rules),
    )
    cut = to_numpy(cut)
    for row in range(3):
        output = [int(t) for t in history[row, :index]]
        expected = numpy_cut(logits[row].astype("float64"), output, rules, model.unk_id)
        banned = np.isinf(expected)
        np.testing.assert_array_equal(cut[row] == IMPOSSIBLE, banned)
        np.testing.assert_allclose(cut[row][~banned], expected[~banned], rtol=1e-6)
        penalized = sorted(set(output) - set(np.flatnonzero(banned)))
        assert penalized and not np.allclose(cut[row][penalized], logits[row][penalized])
        assert banned.sum() >= 3  # EOS (min_length), unk, 7, and the n-gram's


@pytest.mark.parametrize("name", CONTROLS + ["min_length", "all ending"])
def test_greedy_search_applies_each_control_as_the_numpy_rule(model, ending_model, name):  # noqa: F811
    if name in ("min_length", "all ending"):
        model = ending_model  # noqa: F811
        controls = {"min_length": 3}
        if name == "all ending":
            controls.update(no_repeat_ngram_size=1, repetition_penalty=1.5, max_length=12)
            controls.update(disable_unk=True, banned_tokens=[[4, 5], 6])
    else:
        controls = controls_that_bite(model)[name]
    expected = reference_greedy(model, controls)
    plain = plain_greedy(model)
    assert expected != plain, "the control must change some output"
    # Every way of running the search for all controls at once; the default for each alone.
    for use_cache, static_shapes in search_options() if "all" in name else [(True, None)]:
        tokens = greedy_search(
            model, SOURCES, extra_length=EXTRA, use_cache=use_cache,
            static_shapes=static_shapes, controls=controls,
        )  # fmt: skip
        assert rows(tokens) == expected, (use_cache, static_shapes)
    # Nothing changes before the first step where the control bites.
    for ours, before in zip(expected, plain, strict=True):
        first = next(
            (i for i, (a, b) in enumerate(zip(ours, before, strict=False)) if a != b), None
        )
        if first is not None and "repetition" not in name and "all" not in name:  # a ban
            cut = numpy_cut(np.zeros(VOCABULARY), ours[:first], controls, model.unk_id)
            assert cut[before[first]] == -np.inf


def test_disable_unk_bans_the_models_unknown_token(model, monkeypatch):  # noqa: F811
    produced = plain_greedy(model)[0][0]  # make the first token produced "unknown"
    monkeypatch.setattr(model, "unk_id", produced)
    expected = reference_greedy(model, {"disable_unk": True})
    assert all(produced not in output for output in expected)
    assert (
        rows(greedy_search(model, SOURCES, extra_length=EXTRA, controls={"disable_unk": True}))
        == expected
    )


def test_controls_start_after_a_target_prefix_and_count_it(model):  # noqa: F811
    plain = plain_greedy(model)
    # A prefix holding a banned token and a repeated bigram: both are forced.
    prefix = np.array([[plain[0][0], 7, 7, 7], [5, 5, PAD, PAD], [PAD] * 4], "int32")
    controls = {"no_repeat_ngram_size": 1, "banned_tokens": [plain[0][0]], "min_length": 9}
    expected = reference_greedy(model, controls, prefix)
    tokens = greedy_search(
        model, SOURCES, extra_length=EXTRA, target_prefix=prefix, controls=controls
    )
    assert rows(tokens) == expected
    assert expected[0][:4] == list(prefix[0]) and expected[1][:2] == [5, 5]
    assert all(len(output) >= 10 or output[-1] != EOS for output in expected)


def replayed_score(model, source, output, controls, alpha):  # noqa: F811
    """A hypothesis's score under the cut distribution, step by step in NumPy."""
    total = 0.0
    for index, token in enumerate(output):
        logits = numpy_cut(
            step_logits(model, source, output[:index]), output[:index], controls, model.unk_id
        )
        total += numpy_log_softmax(logits)[token]
    return total / float(to_numpy(length_penalty(len(output), alpha)))


@pytest.mark.parametrize("name", ["no_repeat_ngram_size=2", "repetition_penalty=3", "all"])
def test_beam_hypotheses_keep_the_rules_and_score_the_cut_distribution(model, name):  # noqa: F811
    controls = controls_that_bite(model)[name]
    tokens, scores = beam_search(
        model,
        SOURCES,
        beam_size=4,
        num_hypotheses=3,
        alpha=0.6,
        extra_length=EXTRA,
        controls=controls,
    )
    tokens, scores = to_numpy(tokens), to_numpy(scores)
    for sentence, source in enumerate(SOURCES):
        for hypothesis in range(3):
            output = [int(t) for t in tokens[sentence, hypothesis] if t != PAD]
            for index, token in enumerate(output):  # no step chose a token its rules ban
                cut = numpy_cut(np.zeros(VOCABULARY), output[:index], controls, model.unk_id)
                assert cut[token] != -np.inf, (sentence, hypothesis, index)
            expected = replayed_score(model, source, output, controls, 0.6)
            np.testing.assert_allclose(scores[sentence, hypothesis], expected, rtol=1e-4, atol=1e-4)
    one = beam_search(
        model, SOURCES, beam_size=1, alpha=0.0, extra_length=EXTRA, controls=controls
    )[0]
    greedy = greedy_search(model, SOURCES, extra_length=EXTRA, controls=controls)
    np.testing.assert_array_equal(to_numpy(one)[:, 0], to_numpy(greedy))


def test_sampling_with_top_k_one_follows_the_controls_as_greedy_search(model):  # noqa: F811
    controls = controls_that_bite(model)["all"]
    tokens, _ = sample(
        model, SOURCES, num_samples=2, top_k=1, extra_length=EXTRA, seed=1, controls=controls
    )
    greedy = to_numpy(greedy_search(model, SOURCES, extra_length=EXTRA, controls=controls))
    np.testing.assert_array_equal(to_numpy(tokens), np.repeat(greedy[:, None], 2, axis=1))


def test_per_sentence_settings_equal_each_sentences_own_search(model):  # noqa: F811
    first = plain_greedy(model)[0]
    settings = [
        {"no_repeat_ngram_size": 2, "repetition_penalty": 1.0, "min_length": 0, "max_length": 0,
         "banned_tokens": [[first[0], first[1]]]},
        {"no_repeat_ngram_size": 0, "repetition_penalty": 2.0, "min_length": 7, "max_length": 9,
         "banned_tokens": [first[0]]},
        {"no_repeat_ngram_size": 3, "repetition_penalty": 0.8, "min_length": 0, "max_length": 5,
         "banned_tokens": []},
    ]  # fmt: skip
    per_sentence = {
        name: np.array(
            [row[name] for row in settings], "float32" if name == "repetition_penalty" else "int32"
        )
        for name in ("no_repeat_ngram_size", "repetition_penalty", "min_length", "max_length")
    }
    # (B, N, L): a bigram, a single token (right-aligned), nothing (every id "any").
    per_sentence["banned_tokens"] = np.array(
        [[[first[0], first[1]]], [[-1, first[0]]], [[-1, -1]]], "int32"
    )
    together = rows(greedy_search(model, SOURCES, extra_length=EXTRA, controls=per_sentence))
    plain = plain_greedy(model)
    for sentence, row in enumerate(settings):
        alone = {**row, "max_length": row["max_length"] or None}
        expected = reference_greedy(model, alone)[sentence]
        assert together[sentence] == expected, sentence
        assert expected != plain[sentence], sentence  # each sentence's own settings bite


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size=-1"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0.0"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty=inf"),
        ({"banned_tokens": np.zeros((1, 1, 1, 1), "int32")}, "shape=\\(1, 1, 1, 1\\)"),
        ({"min_length": 5, "max_length": 4}, "min_length=5, max_length=4"),
        ({"banned_tokens": [[]]}, "banned_tokens"),
    ],
)
def test_bad_controls_are_named(model, arguments, message):  # noqa: F811
    with pytest.raises(ValueError, match=message):
        greedy_search(model, SOURCES, controls=arguments)


def test_banned_sequences_are_right_aligned():
    laid_out = banned_sequences([4, [5, 6, 7], (8, 9)])
    np.testing.assert_array_equal(laid_out, [[-1, -1, 4], [5, 6, 7], [-1, 8, 9]])


def test_banned_ids_as_an_array_or_a_set_are_single_tokens(model):  # noqa: F811
    first = plain_greedy(model)[0][0]
    expected = rows(
        greedy_search(model, SOURCES, extra_length=EXTRA, controls={"banned_tokens": [first]})
    )
    for banned in (np.array([first]), {first}):
        tokens = greedy_search(
            model, SOURCES, extra_length=EXTRA, controls={"banned_tokens": banned}
        )
        assert rows(tokens) == expected


def test_a_target_prefix_counts_toward_the_minimum_length(ending_model):
    """The ending model would end at once: the minimum alone decides where its outputs end."""
    prefix = np.array([[5, 5, 5], [6, 6, PAD], [PAD] * 3], "int32")
    tokens = rows(
        greedy_search(
            ending_model,
            SOURCES,
            extra_length=EXTRA,
            target_prefix=prefix,
            controls={"min_length": 4},
        )
    )
    assert tokens == reference_greedy(ending_model, {"min_length": 4}, prefix)
    assert [len(output) for output in tokens] == [5, 5, 5]  # 4 tokens, prefix included, then EOS
    assert all(output[-1] == EOS for output in tokens)


def test_decoding_controls_as_a_value_equal_the_dict_and_check_tensors_row_by_row(model):  # noqa: F811
    from keras_transformer import DecodingControls

    controls = {"no_repeat_ngram_size": 2, "banned_tokens": [[4, 5], 6], "disable_unk": True}
    as_dict = rows(greedy_search(model, SOURCES, extra_length=EXTRA, controls=controls))
    value = DecodingControls(**controls)
    assert rows(greedy_search(model, SOURCES, extra_length=EXTRA, controls=value)) == as_dict
    assert DecodingControls().active() is None  # every control neutral: the plain search
    config = value.get_config()
    assert config["banned_tokens"] == [[4, 5], [6]] and config["disable_unk"] is True
    again = rows(
        greedy_search(model, SOURCES, extra_length=EXTRA, controls=value.from_config(config))
    )
    assert again == as_dict
    assert DecodingControls(max_length=None).max_length == 0
    with pytest.raises(ValueError, match="Unknown decoding controls: \\['no_repeat'\\]"):
        greedy_search(model, SOURCES, controls={"no_repeat": 2})
    with pytest.raises(TypeError, match="Received: list"):
        greedy_search(model, SOURCES, controls=[2])
    # The same rules check one value a sentence: row 1's penalty, row 2's lengths.
    tensors = {
        "no_repeat_ngram_size": np.array([0, 2, 1]),
        "repetition_penalty": np.array([1.0, 0.0, 1.2]),
        "min_length": np.array([0, 0, 5]),
        "max_length": np.array([0, 3, 4]),
        "disable_unk": np.array([False, True, False]),
    }
    invalid = {
        message: np.flatnonzero(~np.asarray(valid))
        for valid, message, _ in DecodingControls.rules(tensors)
    }
    assert invalid["repetition_penalty must be positive and finite"].tolist() == [1]
    assert invalid["min_length must not exceed max_length"].tolist() == [2]
    assert sum(len(rows) for rows in invalid.values()) == 2
