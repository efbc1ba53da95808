"""int8 exports: what they store, that a bare TensorFlow serves them, and their BLEU."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer import score_hypotheses
from pipelines.commands import export as export_command
from pipelines.commands import train
from pipelines.commands import translate as translate_command
from pipelines.data.tokenizer import EOS_ID
from pipelines.serving.client import export_settings
from pipelines.serving.quantization import quantized
from pipelines.serving.translation import encode
from tests.pipelines.conftest import shared_data
from tests.pipelines.serving.test_saved_model import (
    ENV,
    HERE,
    INPUTS,
    MAX_SOURCE_LENGTH,
    graph_ops,
    keras_beam_search,
    read_ops,
    tiny_export,
)

# One worker runs the module, so its module fixtures are built once (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("int8")


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    return tiny_export(tmp_path_factory.mktemp("int8"), quantize="int8")


def test_a_bare_tensorflow_serves_every_signature_as_the_int8_keras_search(int8_export, tmp_path):
    translator, model, _, path = int8_export
    inputs_path = tmp_path / "inputs.json"
    inputs_path.write_text(json.dumps([text.decode("latin-1") for text in INPUTS]))
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "serving_client.py"), path, str(inputs_path)],
        capture_output=True, text=True, env=ENV, cwd=str(tmp_path), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout)
    assert served["modules"] == [] and len(served["signatures"]) == 10
    real = [0, 1, 4, 6]
    int8_model = quantized(model, "int8")
    expected, scores = keras_beam_search(translator, int8_model, [INPUTS[i] for i in real])
    for row, index in enumerate(real):
        assert served["nbest"][index] == expected[row]
        np.testing.assert_allclose(served["nbest_scores"][index], scores[row], rtol=1e-4)
    # Every signature answered; `score` as `score_hypotheses` on the int8 model.
    assert served["controlled_neutral"] == served["translations"]
    assert served["greedy"][0] and served["prefixed"] and served["sampled"]
    sources = tf.constant([INPUTS[i] for i in real])
    targets = tf.constant([served["beam_alpha0_translations"][i] for i in real])
    source = encode(translator.tokenizer, sources, EOS_ID, MAX_SOURCE_LENGTH).to_tensor()
    target = encode(translator.tokenizer, targets, EOS_ID).to_tensor()
    np.testing.assert_allclose(
        [served["scored"][i] for i in real],
        score_hypotheses(int8_model, source, target),
        rtol=1e-4,
    )


def test_the_export_stores_int8_matrices_and_records_the_mode(int8_export):
    translator, model, _, path = int8_export
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    saved = {
        name: np.prod(shapes[name], dtype=int) * dtypes[name].size
        for name in dtypes
        if "/.ATTRIBUTES/VARIABLE_VALUE" in name and not name.startswith("_CHECKPOINTABLE")
    }
    int8 = [name for name in saved if dtypes[name] == tf.int8]
    # 1 shared embedding, 4 + 8 attention projections, 2 x 2 feed-forward.
    assert len(int8) == 1 + 12 + 4
    matrices = sum(np.prod(v.shape) for v in model.weights if v.name in ("kernel", "embeddings"))
    assert sum(saved[name] for name in int8) == matrices
    float_bytes = sum(np.prod(v.shape) * 4 for v in model.weights)
    assert sum(saved.values()) < 0.4 * float_bytes
    assert export_settings(path)["quantize"] == "int8"
    # Below float32 weights and the graph of 10 signatures (at most 4 vocabulary copies each).
    assert translator.estimated_bytes() < float_bytes + 40 * translator.vocabulary_bytes + 2**20


def test_the_int8_graph_uses_only_ops_tf_serving_2_20_registers(int8_export):
    ops = graph_ops(int8_export[3])
    missing = ops - read_ops("tf_text_2.20.0_ops.txt") - read_ops("tensorflow_2.20.0_ops.txt")
    assert not missing, f"not in TF Serving 2.20: {missing}"
    assert "BatchMatMulV3" in ops  # the int8 products
    assert not {op for op in ops if op.startswith("Xla")}


def test_the_export_saves_no_gradient_functions(int8_export):
    """Keras's int8 products each carry a custom gradient, which inference never calls."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(int8_export[3], "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    (graph,) = saved.meta_graphs
    names = [function.signature.name for function in graph.graph_def.library.function]
    assert any("while_body" in name for name in names)  # the searches' loops are there
    assert not [name for name in names if "grad_fn" in name]
    # Nor a gradient among the functions the loader restores.
    assert not [name for name in graph.object_graph_def.concrete_functions if "grad" in name]


def test_an_unknown_mode_is_refused_before_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        export_command.main(["--run-dir", str(tmp_path), "--quantize", "int4"])
    assert raised.value.code == 2
    assert "--quantize: invalid choice: 'int4'" in capsys.readouterr().err


def bleu(translations, references):
    return sacrebleu.corpus_bleu(translations, [references]).score


@pytest.mark.slow
@pytest.mark.release  # trains on Multi30k, then translates its test set three times
def test_int8_exports_translate_multi30k_within_half_a_bleu_of_float32(tmp_path):
    """A small model trained on Multi30k (about 4 minutes on 2 cores), exported three ways."""
    multi30k = shared_data("multi30k")
    run = str(tmp_path / "run")
    settings = {
        "model.num_layers": "2",
        "steps": "1500",
        "steps_per_epoch": "500",
        "average_last": "1",
        "vocabulary_size": "4000",
    }
    argv = ["--recipe", "multi30k", "--multi30k-dir", multi30k, "--output-dir", run]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    assert train.main(argv) == 0
    with gzip.open(os.path.join(multi30k, "test_2016_flickr.en.gz"), "rt") as handle:
        (tmp_path / "test.en").write_text(handle.read())
    with gzip.open(os.path.join(multi30k, "test_2016_flickr.de.gz"), "rt") as handle:
        references = handle.read().splitlines()
    scores = {}
    for mode in ("float32", "int8", "int8-weights"):
        quantize = [] if mode == "float32" else ["--quantize", mode]
        base = ["--run-dir", run, "--base", str(tmp_path / "models"), "--name", mode]
        assert export_command.main([*base, *quantize, "--signatures", "serving_default"]) == 0
        output = tmp_path / f"{mode}.de"
        model = str(tmp_path / "models" / mode)
        argv = ["--model", model, "--input", str(tmp_path / "test.en"), "--output", str(output)]
        assert translate_command.main(argv) == 0
        scores[mode] = bleu(output.read_text().splitlines(), references)
    assert scores["float32"] > 20, scores  # a trained model, not a random one
    for mode in ("int8", "int8-weights"):
        assert abs(scores[mode] - scores["float32"]) <= 0.5, scores
