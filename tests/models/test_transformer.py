import pathlib

import keras
import numpy as np
import pytest

from keras_transformer import PRESETS, Transformer
from tests.test_case import check_config_round_trip, run_model_saving_test, to_numpy

V = 20
SOURCE = np.array([[5, 6, 7, 8, 3, 0], [9, 4, 3, 0, 0, 0]], "int32")
TARGET = np.array([[2, 5, 6, 7, 8], [2, 9, 4, 0, 0]], "int32")


def tiny(**kwargs):
    options = {"num_layers": 2, "hidden_dim": 8, "intermediate_dim": 16, "num_heads": 2}
    return Transformer(vocabulary_size=V, **{**options, **kwargs})


def test_logits_shape_and_dtype():
    logits = tiny()((SOURCE, TARGET))
    assert tuple(logits.shape) == (2, 5, V)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_logits_are_float32(policy):
    model = tiny(dtype=policy)
    logits = model((SOURCE, TARGET))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in model.weights)


def test_dict_inputs_equal_tuple_inputs():
    model = tiny()
    np.testing.assert_array_equal(
        to_numpy(model((SOURCE, TARGET))),
        to_numpy(model({"source_ids": SOURCE, "target_input_ids": TARGET})),
    )
    with pytest.raises(ValueError, match="target_input_ids"):
        model({"source_ids": SOURCE})


def _decoder_states(model):
    """The `(B, T, D)` decoder outputs the output layer turns into logits."""
    encoder_outputs, source_mask = model.encode(SOURCE)
    states = model.target_positions(model.target_embedding(TARGET))
    return model.decoder(
        states,
        encoder_outputs,
        decoder_padding_mask=model.padding_mask(TARGET),
        encoder_padding_mask=source_mask,
    )


def test_one_matrix_for_source_target_and_output():
    """Section 3.4: the two embeddings and the pre-softmax projection share one matrix."""
    shared = tiny()
    logits = to_numpy(shared((SOURCE, TARGET)))
    embeddings = [w for w in shared.weights if "embeddings" in w.path]
    assert len(embeddings) == 1 and shared.output_projection is None
    assert shared.source_embedding is shared.target_embedding
    # The logits are the decoder states times the transposed embedding matrix.
    matrix = to_numpy(embeddings[0])  # (V, D)
    expected = to_numpy(_decoder_states(shared)) @ matrix.T
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)

    separate = tiny(share_source_target_embeddings=False, tie_output_embeddings=False)
    logits = to_numpy(separate((SOURCE, TARGET)))
    assert len([w for w in separate.weights if "embeddings" in w.path]) == 2
    target_matrix = to_numpy(separate.target_embedding.embeddings)
    untied = to_numpy(_decoder_states(separate)) @ target_matrix.T
    assert not np.allclose(logits, untied, atol=1e-3)
    assert separate.count_params() - shared.count_params() == V * 8 + (V * 8 + V)


def test_separate_vocabularies():
    model = tiny(target_vocabulary_size=30, share_source_target_embeddings=False)
    assert tuple(model((SOURCE, TARGET)).shape) == (2, 5, 30)
    with pytest.raises(ValueError, match="target_vocabulary_size=30"):
        tiny(target_vocabulary_size=30)


def test_padding_and_future_tokens_do_not_leak():
    model = tiny()
    real = TARGET != 0
    logits = to_numpy(model((SOURCE, TARGET)))
    target = TARGET.copy()
    target[0, -1] = 11  # a future token for every earlier position of row 0
    new_logits = to_numpy(model((SOURCE, target)))
    np.testing.assert_allclose(new_logits[:, :-1], logits[:, :-1], atol=1e-5)
    assert not np.allclose(new_logits[0, -1], logits[0, -1])
    # More source and target padding changes no real position's logits.
    longer = to_numpy(model((np.pad(SOURCE, ((0, 0), (0, 3))), np.pad(TARGET, ((0, 0), (0, 2))))))
    np.testing.assert_allclose(longer[:, :5][real], logits[real], atol=1e-5)


@pytest.mark.parametrize("cache_length", [0, 6])
def test_decoding_steps_give_the_full_pass_log_probabilities(cache_length):
    # Every dropout set high: none may act in the full pass or the cached steps.
    model = tiny(dropout=0.5, attention_dropout=0.5, activation_dropout=0.5)
    full = to_numpy(keras.ops.log_softmax(model((SOURCE, TARGET)), axis=-1))
    state = model.start_decoding(SOURCE, cache_length)
    for index in range(TARGET.shape[1]):
        log_probs, state = model.decoding_step(
            TARGET[:, index], state, index if cache_length else None
        )
        real = TARGET[:, index] != 0
        np.testing.assert_allclose(to_numpy(log_probs)[real], full[real, index], atol=1e-5)


def test_a_start_token_equal_to_padding_is_attended_to():
    """Marian models start decoding with the padding token: the full pass must still see it."""
    model = tiny(pad_id=0, bos_id=0)
    target = np.where(TARGET == 2, 0, TARGET)  # (B, T): 0 first, then the tokens, then padding
    full = to_numpy(keras.ops.log_softmax(model((SOURCE, target)), axis=-1))
    state = model.start_decoding(SOURCE)
    for index in range(2):  # both rows' first two tokens are real
        log_probs, state = model.decoding_step(target[:, index], state)
        np.testing.assert_allclose(to_numpy(log_probs), full[:, index], atol=1e-5)
    mask = to_numpy(model.target_padding_mask(target))
    np.testing.assert_array_equal(mask, (target != 0) | (np.arange(5) == 0))


def test_output_bias_is_added_to_the_tied_logits(tmp_path):
    model = tiny(output_bias=True)
    model((SOURCE, TARGET))
    bias = np.linspace(-1.0, 1.0, V).astype("float32")
    model.logits_bias.assign(bias)
    expected = to_numpy(_decoder_states(model)) @ to_numpy(model.target_embedding.embeddings).T
    np.testing.assert_allclose(to_numpy(model((SOURCE, TARGET))), expected + bias, atol=1e-5)
    plain = tiny()
    plain((SOURCE, TARGET))
    assert model.count_params() == plain.count_params() + V
    restored = run_model_saving_test(model, (SOURCE, TARGET), tmp_path)
    np.testing.assert_array_equal(to_numpy(restored.logits_bias), bias)
    # An untied projection has its own bias; no second one is made.
    untied = tiny(output_bias=True, tie_output_embeddings=False)
    untied((SOURCE, TARGET))
    assert untied.logits_bias is None and untied.output_projection.bias is not None


def test_concatenated_sinusoids_reach_both_sides(tmp_path):
    model = tiny(sinusoid_layout="concatenated")
    assert model.source_positions.sinusoid_layout == "concatenated"
    assert model.target_positions.sinusoid_layout == "concatenated"
    model((SOURCE, TARGET))
    paper = tiny()
    paper((SOURCE, TARGET))
    paper.set_weights(model.get_weights())
    assert not np.allclose(to_numpy(model((SOURCE, TARGET))), to_numpy(paper((SOURCE, TARGET))))
    restored = run_model_saving_test(model, (SOURCE, TARGET), tmp_path)
    assert restored.get_config()["sinusoid_layout"] == "concatenated"


def test_config_and_keras_file_round_trip(tmp_path):
    model = tiny(
        learned_positions=True, max_positions=16, normalize_first=True, activation_dropout=0.3
    )
    check_config_round_trip(model)
    model((SOURCE, TARGET))
    restored = run_model_saving_test(model, (SOURCE, TARGET), tmp_path)
    assert restored.get_config() == model.get_config()
    # Every layer's FeedForward gets the rate.
    for stack in (restored.encoder, restored.decoder):
        assert [layer.feed_forward.dropout for layer in stack.stack_layers] == [0.3, 0.3]


def test_compiled_model_round_trips_with_loss_and_metric(tmp_path):
    from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy, transformer_optimizer

    model = tiny()
    model.compile(
        optimizer=transformer_optimizer(8, warmup_steps=10),
        loss=LabelSmoothedCrossEntropy(),
        metrics=[MaskedAccuracy()],
    )
    labels = np.array([[5, 6, 7, 8, 3], [9, 4, 3, 0, 0]])
    model.fit((SOURCE, TARGET), labels, epochs=1, verbose=0)
    restored = run_model_saving_test(model, (SOURCE, TARGET), tmp_path)
    np.testing.assert_allclose(
        restored.evaluate((SOURCE, TARGET), labels, verbose=0),
        model.evaluate((SOURCE, TARGET), labels, verbose=0),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "preset, paper_millions, tolerance",
    # Table 3 reports 65M and 213M; the base figure rounds the same model up by ~3%.
    [("transformer_base", 65, 0.04), ("transformer_big", 213, 0.02)],
)
def test_parameter_counts_match_table_3(preset, paper_millions, tolerance):
    model = Transformer.from_preset(preset, vocabulary_size=37000)
    model.build(((None, None), (None, None)))
    count = model.count_params()
    d, ff, n = PRESETS[preset]["hidden_dim"], PRESETS[preset]["intermediate_dim"], 6
    attention = 4 * (d * d + d)
    feed_forward = d * ff + ff + ff * d + d
    expected = (
        37000 * d
        + n * (attention + feed_forward + 4 * d)
        + n * (2 * attention + feed_forward + 6 * d)
    )
    assert count == expected
    assert abs(count / 1e6 - paper_millions) / paper_millions < tolerance


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="transformer_base"):
        Transformer.from_preset("transformer_huge", vocabulary_size=10)


DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


def test_a_model_saved_by_0_1_0_loads_with_its_weights():
    """Saved before `max_length` became `max_positions`: weights and outputs unchanged."""
    model = keras.saving.load_model(DATA / "transformer-0.1.0.keras", safe_mode=True)
    assert model.max_positions == 12 and model.learned_positions
    saved = np.load(DATA / "transformer-0.1.0-outputs.npz")
    logits = model((saved["source_ids"], saved["target_input_ids"]))
    np.testing.assert_allclose(to_numpy(logits), saved["logits"], atol=1e-5)


@pytest.mark.parametrize(
    "cls, old, new",
    [
        ("TokenEmbedding", {"vocabulary_size": 5, "embedding_dim": 4}, "hidden_dim"),
        ("PositionalEncoding", {"learned": True, "max_length": 7}, "max_positions"),
        ("TransformerSchedule", {"d_model": 16}, "hidden_dim"),
    ],
)
def test_configs_saved_by_0_1_0_load_under_the_new_names(cls, old, new):
    import keras_transformer

    restored = getattr(keras_transformer, cls).from_config(old)
    (value,) = (v for k, v in old.items() if k not in ("vocabulary_size", "learned"))
    assert getattr(restored, new) == value
    assert new in restored.get_config()


@pytest.mark.parametrize("activations", [True, False], ids=["int8", "int8-weights"])
def test_an_int8_model_decodes_as_its_full_pass_and_near_float32(activations):
    """`Model.quantize("int8")` reaches every matrix, the cached decoding path's too."""
    model = tiny(tie_output_embeddings=False, share_source_target_embeddings=False)
    float_logits = to_numpy(model((SOURCE, TARGET)))
    config = None
    if not activations:
        config = keras.quantizers.Int8QuantizationConfig(
            weight_quantizer=None, activation_quantizer=None
        )
    model.quantize("int8", config=config)
    quantized = [v for v in model.weights if keras.backend.standardize_dtype(v.dtype) == "int8"]
    # One int8 matrix a layer: 2 embeddings, 4 x 2 + 4 x 2 x 2 attention projections,
    # 2 x 2 x 2 feed-forward, the output projection.
    assert len(quantized) == 2 + 24 + 8 + 1
    logits = to_numpy(model((SOURCE, TARGET)))
    real = TARGET != 0
    error = np.abs(logits - float_logits)[real].max()
    assert 0 < error < 0.05 * np.abs(float_logits[real]).max()
    full = to_numpy(keras.ops.log_softmax(logits, axis=-1))
    state = model.start_decoding(SOURCE, 6)
    for index in range(TARGET.shape[1]):
        log_probs, state = model.decoding_step(TARGET[:, index], state, index)
        real = TARGET[:, index] != 0
        np.testing.assert_allclose(to_numpy(log_probs)[real], full[real, index], atol=1e-4)


def int8_tied_model():
    """A tied model whose target embedding alone is int8 (so only it casts int8)."""
    from keras_transformer.layers import TokenEmbedding

    model = tiny()
    model((SOURCE, TARGET))
    model.quantize("int8", filters=lambda layer: isinstance(layer, TokenEmbedding))
    assert model.step_constants(), "an int8 tied projection has a table to hoist"
    return model


def test_an_int8_tied_projection_casts_its_table_once_a_search_not_once_a_step(monkeypatch):
    """Same tokens with the table cast once or at every step; eager loops count the casts."""
    from keras_transformer import beam_search, greedy_search
    from keras_transformer.layers import TokenEmbedding

    keras.utils.set_random_seed(0)
    model = int8_tied_model()
    eager = keras.backend.backend() != "jax"  # JAX traces a loop's body once
    counts = {"table": 0, "step": 0}
    table, step, constants = (
        TokenEmbedding.output_table, Transformer.decoding_step, Transformer.step_constants
    )  # fmt: skip

    def counted(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(TokenEmbedding, "output_table", counted("table", table))
    monkeypatch.setattr(Transformer, "decoding_step", counted("step", step))
    # At least 5 steps: the end token is banned before 5 tokens (the controlled path).
    options = {"max_output_length": 6, "controls": {"min_length": 5}}

    def beam(*args, **kwargs):
        return beam_search(*args, beam_size=3, **kwargs)[0]  # the ids, not the scores

    for search in (greedy_search, beam):
        monkeypatch.setattr(Transformer, "step_constants", constants)
        counts.update(table=0, step=0)
        hoisted = to_numpy(search(model, SOURCE, **options))
        if eager:
            assert counts["step"] >= 5 and counts["table"] == 1, counts
        # The same search with the table cast at every step: the same tokens.
        monkeypatch.setattr(Transformer, "step_constants", lambda self: {})
        counts.update(table=0, step=0)
        np.testing.assert_array_equal(to_numpy(search(model, SOURCE, **options)), hoisted)
        assert counts["table"] == counts["step"] >= 1


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow graphs")
def test_an_int8_tied_projection_casts_no_int8_table_inside_the_decoding_loop():
    import tensorflow as tf

    from keras_transformer import greedy_search

    model = int8_tied_model()
    search = tf.function(lambda ids: greedy_search(model, ids, max_output_length=6))
    graph = search.get_concrete_function(tf.TensorSpec((None, None), tf.int32)).graph
    definition = graph.as_graph_def()

    def int8_casts(nodes):
        int8 = tf.int8.as_datatype_enum
        return [n for n in nodes if n.op == "Cast" and n.attr["SrcT"].type == int8]

    loop_bodies = [f for f in definition.library.function if "body" in f.signature.name]
    inside = [n for f in loop_bodies for n in int8_casts(f.node_def)]
    # Inside the loop, the only int8 casts are of the rows a step looks up (a gather)...
    assert inside and all("Gather" in n.input[0] for n in inside), inside
    # ... and the one cast of the (V, D) table sits before the loop, outside its body.
    (table,) = [n for n in int8_casts(definition.node) if "Gather" not in n.input[0]]
