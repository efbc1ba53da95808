"""Time and peak memory of one large SavedModel request against many small ones.

Usage:
    python benchmarks/request_size.py --run-dir runs/multi30k \
        --source ../shared/data/multi30k/train.en.gz [--sentences 2048]

Exports the run as a SavedModel, then translates the first `--sentences`
sentences of `--source` with `serving_default` (beam 4) in a fresh process per
request size: all of them in one request, and in requests of `--small` (64)
sentences one after another. Each process loads the SavedModel with TensorFlow
and tensorflow-text alone (`tf.saved_model.load`, or with `--loader session`
in a TF1 Session, the C++ path TF Serving takes), warms up on a few
sentences, and reports its
wall-clock time per sentence and its peak resident memory (`VmHWM` of
/proc/self/status where there is one: `ru_maxrss` keeps the spawning process's
peak across `exec`, so a large parent would hide the client's own; it
includes the loaded model). Prints a table and writes
benchmarks/results/request_size.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, export_run, table, write_result  # noqa: E402

CLIENT = """
import hashlib, json, resource, sys, time
import tensorflow as tf
import tensorflow_text  # noqa: F401

path, sentences_path, request, loader = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(sentences_path, encoding="utf-8") as handle:
    sentences = json.load(handle)


def peak_kib():
    # VmHWM is this process's own peak; ru_maxrss also counts the parent's before exec.
    try:
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("VmHWM")).split()[1])
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if loader == "session":  # TF Serving's path: the graph in a TF1 Session, no Python functions
    tf.compat.v1.disable_eager_execution()
    session = tf.compat.v1.Session()
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    signature = meta_graph.signature_def["serving_default"]
    feed = signature.inputs["inputs"].name
    fetches = {name: output.name for name, output in signature.outputs.items()}
    serve = lambda batch: session.run(fetches, {feed: batch})["translations"]  # noqa: E731
else:
    restored = tf.saved_model.load(path).signatures["serving_default"]
    serve = lambda batch: restored(inputs=tf.constant(batch))["translations"].numpy()  # noqa: E731
serve(sentences[:8])  # warm-up
loaded = peak_kib()
digest = hashlib.sha1()
started = time.perf_counter()
for start in range(0, len(sentences), request):
    for translation in serve(sentences[start : start + request]):
        digest.update(translation + b"\\n")
seconds = time.perf_counter() - started
peak = peak_kib()
print(json.dumps({"seconds": seconds, "loaded_kib": loaded, "peak_kib": peak,
                  "translations_sha1": digest.hexdigest()}))
"""

LOADERS = ("saved_model", "session")


def run_client(path, sentences_path, request, loader="saved_model"):
    """Runs one request size in a fresh process; returns its JSON report.

    `loader`: one of `LOADERS`: "saved_model" (`tf.saved_model.load`, its
    functions rebuilt in Python) or "session" (the graph in a TF1 `Session`,
    the C++ path TF Serving takes). The report's `translations_sha1` digests
    the translations, so that two loaders' outputs can be compared."""
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, path, sentences_path, str(request), loader],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"request size {request} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    parser.add_argument("--source", required=True, help="sentences, one a line (.gz read too)")
    parser.add_argument("--sentences", type=int, default=2048)
    parser.add_argument("--small", type=int, default=64, help="sentences per small request")
    parser.add_argument(
        "--loader", choices=LOADERS, default="saved_model",
        help="tf.saved_model.load, or a TF1 Session as TF Serving loads a SavedModel",
    )  # fmt: skip
    parser.add_argument("--output", default=os.path.join(RESULTS, "request_size.json"))
    args = parser.parse_args(argv)

    from pipelines.data.corpus import read_lines
    from pipelines.serving.translation import CHUNK_SIZE

    sentences = read_lines(args.source)[: args.sentences]
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as work_dir:
        path = export_run(args.run_dir, os.path.join(work_dir, "model"))
        sentences_path = os.path.join(work_dir, "sentences.json")
        with open(sentences_path, "w", encoding="utf-8") as handle:
            json.dump(sentences, handle)
        for request in (len(sentences), args.small):
            report = run_client(path, sentences_path, request, args.loader)
            key = f"requests_of_{request}"
            results[key] = {
                "request_size": request,
                "requests": -(-len(sentences) // request),
                "seconds": round(report["seconds"], 2),
                "milliseconds_per_sentence": round(1000 * report["seconds"] / len(sentences), 2),
                "peak_rss_mib": round(report["peak_kib"] / 1024),
                "rss_after_loading_mib": round(report["loaded_kib"] / 1024),
            }
            rows.append([request, results[key]["requests"], results[key]["seconds"],
                         results[key]["milliseconds_per_sentence"],
                         results[key]["peak_rss_mib"]])  # fmt: skip
            print(f"requests of {request}: {report['seconds']:.1f} s", flush=True)
    large, small = (results[f"requests_of_{n}"] for n in (len(sentences), args.small))
    write_result(
        {
            "benchmark": "request_size",
            "command": "python benchmarks/request_size.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "sentences": len(sentences),
            "loader": args.loader,
            "beam_size": 4,
            "chunk_size": CHUNK_SIZE,
            "results": results,
            "large_over_small_time_per_sentence": round(
                large["milliseconds_per_sentence"] / small["milliseconds_per_sentence"], 3
            ),
        },
        args.output,
    )
    print(table(["request size", "requests", "seconds", "ms / sentence", "peak RSS MiB"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
