"""TF Serving's warm-up requests: what an export asks of each signature before it serves.

TF Serving replays `assets.extra/tf_serving_warmup_requests` when it loads a
version, and one failed request fails the load: the version never becomes
AVAILABLE. With `--enable_batching` the requests run through the batcher,
which refuses inputs without a batch dimension ("input tensors must have at
least one dimension"), so an export for it (`export(..., batching=True)`,
`kt export --batching`) leaves out `translate` and `controlled_search`, whose
beam size and alpha are scalars; every other signature is batch-major and
stays in.
"""

import os

import tensorflow as tf

from pipelines.files import read_json, write_json
from pipelines.serving.client import SETTINGS_FILE, SIGNATURE_INPUT
from pipelines.serving.controls import CONTROLS, NEUTRAL

# Where TF Serving looks for them in a version's folder.
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def batcher_accepts(inputs):
    """Whether TF Serving's batcher takes a request: every input `(B, ...)`, one `B` for all.

    Args:
        inputs: dict of input name to `TensorProto`, as a `PredictRequest`
            holds them.

    Returns:
        bool.
    """
    shapes = [[dim.size for dim in proto.tensor_shape.dim] for proto in inputs.values()]
    return all(shapes) and len({shape[0] for shape in shapes}) == 1


# Requests TF Serving replays at load (assets.extra/tf_serving_warmup_requests):
# a small batch, then a batch of many lengths, so that the first real requests
# find every signature's graph and most of its kernels initialized.
WARMUP_BATCHES = [
    ["Hello.", "A short sentence for the warm-up request.", ""],
    [" ".join(["word"] * length) for length in range(1, 65)],
]


WARMUP_CONTROLS = {
    "no_repeat_ngram_size": 3, "repetition_penalty": 1.2, "min_length": 2, "max_length": 60,
    "disable_unk": True, "banned_words": "word\nshort sentence",
}  # fmt: skip


def warmup_requests(name="model", batching=False, signatures=None):
    """TF Serving warm-up requests: one `PredictionLog` for each signature.

    Args:
        name: str, the model name the requests carry (TF Serving ignores it
            while warming up and uses the model being loaded).
        batching: bool, leave out the requests the batcher refuses
            (`batcher_accepts`): `translate`'s and `controlled_search`'s
            (see the module docstring).
        signatures: collection of str or None, the export's signatures:
            requests to others are left out (None: every signature).

    Returns:
        list of `tensorflow_serving.apis.prediction_log_pb2.PredictionLog`.
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    # Greedy and beam search are two branches of `translate` and `controlled_search`.
    searches = [
        {
            "beam_size": tf.make_tensor_proto(beam_size, tf.int32),
            "alpha": tf.make_tensor_proto(0.6, tf.float32),
            "penalty_form": tf.make_tensor_proto(""),
        }
        for beam_size in (1, 4)
    ]
    inputs = []
    for batch in WARMUP_BATCHES:
        sentences = tf.make_tensor_proto(batch, tf.string)
        prefixes = tf.make_tensor_proto([text[:8] for text in batch], tf.string)
        inputs += [
            ("serving_default", {SIGNATURE_INPUT: sentences}),
            ("nbest", {SIGNATURE_INPUT: sentences}),
            ("score", {"sources": sentences, "targets": sentences}),
            ("prefix", {SIGNATURE_INPUT: sentences, "prefixes": prefixes}),
            ("align", {SIGNATURE_INPUT: sentences, "prefixes": prefixes}),
        ]
        inputs += [("translate", {SIGNATURE_INPUT: sentences, **search}) for search in searches]
        rows = len(batch)
        for top_k in (0, 10):  # sampling with and without the sorting branch
            settings = {
                "temperature": tf.make_tensor_proto([1.0] * rows, tf.float32),
                "top_k": tf.make_tensor_proto([top_k] * rows, tf.int32),
                "top_p": tf.make_tensor_proto([1.0] * rows, tf.float32),
                "seed": tf.make_tensor_proto(list(range(rows)), tf.int64),
            }
            inputs.append(("sample", {SIGNATURE_INPUT: sentences, **settings}))
        # Controls off, then each on (greedy or beam is the export's).
        for value in (NEUTRAL, WARMUP_CONTROLS):
            controls = {
                name: tf.make_tensor_proto([setting] * rows, CONTROLS[name][0])
                for name, setting in value.items()
            }
            inputs.append(("controlled", {SIGNATURE_INPUT: sentences, **controls}))
            # Any search and sampling with prefixes and controls: both branches of each.
            guided = {SIGNATURE_INPUT: sentences, "prefixes": prefixes, **controls}
            inputs += [("controlled_search", {**guided, **search}) for search in searches]
            inputs.append(("controlled_sample", {**guided, **settings}))  # top_k 10's
    logs = []
    for signature, tensors in inputs:
        if batching and not batcher_accepts(tensors):
            continue
        if signatures is not None and signature not in signatures:
            continue
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=name, signature_name=signature)
        )
        for key, proto in tensors.items():
            request.inputs[key].CopyFrom(proto)
        logs.append(prediction_log_pb2.PredictionLog(predict_log={"request": request}))
    return logs


def write_warmup_requests(saved_model_dir, batching=False, signatures=None):
    """Writes `assets.extra/tf_serving_warmup_requests` into a SavedModel folder.

    TF Serving replays these requests when it loads the version, before it
    serves it, so no client pays for initializing a signature's graph.

    Args:
        saved_model_dir: str, the SavedModel's folder.
        batching: bool, requests for `--enable_batching` (`warmup_requests`),
            also recorded in the version's `keras_transformer.json` where it has one.
        signatures: collection of str or None, the export's signatures
            (None: those its `keras_transformer.json` lists, or every one).

    Returns:
        str, the file written.
    """
    path = os.path.join(saved_model_dir, WARMUP_FILE)
    settings = os.path.join(saved_model_dir, SETTINGS_FILE)
    recorded = read_json(settings) if os.path.exists(settings) else None
    if signatures is None and recorded is not None:
        signatures = recorded.get("signatures")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for log in warmup_requests(batching=batching, signatures=signatures):
            writer.write(log.SerializeToString())
    if recorded is not None:  # a version's warm-up rewritten in place: its record follows
        write_json(settings, {**recorded, "batching": batching})
    return path


def read_warmup_requests(saved_model_dir):
    """The warm-up requests of an export, in order.

    Returns:
        list of `tensorflow_serving.apis.predict_pb2.PredictRequest`.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(saved_model_dir, WARMUP_FILE)
    return [
        prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        for record in tf.data.TFRecordDataset(path)
    ]
