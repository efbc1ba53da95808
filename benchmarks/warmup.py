"""First requests after loading the SavedModel, with and without its warm-up requests replayed.

Usage:
    python benchmarks/warmup.py --run-dir runs/multi30k --multi30k-dir ../shared/data/multi30k

Exports the run, then in a fresh process per run: loads the SavedModel with
TensorFlow and tensorflow-text alone, replays (or not) the export's
`assets.extra/tf_serving_warmup_requests` as TF Serving does before serving a
version, and times ten `serving_default` requests of `--request` sentences
one after another. Reports the first and the tenth request's seconds, each
the median of `--repeats` processes, the two modes alternating. Writes
benchmarks/results/warmup.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    export_run,
    median,
    read_parallel,
    table,
    write_result,
)
from pipelines.serving.warmup import WARMUP_FILE  # noqa: E402

CLIENT = """
import json, sys, time
import tensorflow as tf
import tensorflow_text  # noqa: F401
from tensorflow_serving.apis import prediction_log_pb2

path, sentences_path, records = sys.argv[1], sys.argv[2], sys.argv[3]
with open(sentences_path, encoding="utf-8") as handle:
    sentences = json.load(handle)
signatures = tf.saved_model.load(path).signatures
if records:  # the warm-up file, replayed as TF Serving does
    for record in tf.data.TFRecordDataset(records):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        signatures[request.model_spec.signature_name](**inputs)
seconds = []
for _ in range(10):
    started = time.perf_counter()
    signatures["serving_default"](inputs=tf.constant(sentences))
    seconds.append(time.perf_counter() - started)
print(json.dumps(seconds))
"""


def run_client(path, sentences_path, replay):
    """Ten request times from a fresh process; `replay` warms it up first."""
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, path, sentences_path,
         os.path.join(path, WARMUP_FILE) if replay else ""],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"client failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "val")
    parser.add_argument("--request", type=int, default=64, help="sentences a request")
    parser.add_argument("--repeats", type=int, default=3, help="processes per mode")
    parser.add_argument("--output", default=os.path.join(RESULTS, "warmup.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "val")

    times = {"replayed": [], "cold": []}
    with tempfile.TemporaryDirectory() as work_dir:
        path = export_run(args.run_dir, os.path.join(work_dir, "model"))
        sentences_path = os.path.join(work_dir, "sentences.json")
        with open(sentences_path, "w", encoding="utf-8") as handle:
            json.dump(sources[: args.request], handle)
        for repeat in range(args.repeats):
            modes = ["replayed", "cold"] if repeat % 2 == 0 else ["cold", "replayed"]
            for mode in modes:
                times[mode].append(run_client(path, sentences_path, mode == "replayed"))
    results = {
        mode: {
            "first_seconds": round(median([run[0] for run in runs]), 3),
            "tenth_seconds": round(median([run[9] for run in runs]), 3),
        }
        for mode, runs in times.items()
    }
    for entry in results.values():
        entry["first_over_tenth"] = round(entry["first_seconds"] / entry["tenth_seconds"], 2)
    write_result(
        {
            "benchmark": "warmup",
            "command": "python benchmarks/warmup.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "request_sentences": len(sources[: args.request]),
            "seconds": times,
            "results": results,
        },
        args.output,
    )
    rows = [[mode, r["first_seconds"], r["tenth_seconds"], r["first_over_tenth"]]
            for mode, r in results.items()]  # fmt: skip
    print(table(["mode", "first request s", "tenth request s", "first / tenth"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
