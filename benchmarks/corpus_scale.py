"""Memory and speed of `kt train`'s data path as the corpus grows.

For each size, a synthetic parallel corpus is built from Multi30k's training
lines joined two by two (about 140 characters a side, like WMT's), and
`kt train --corpus files` trains a tiny model on it for `--steps` steps in a
process of its own, while this script samples the process's peak resident
memory (`VmHWM`) from /proc: at the end of preparation (the first training
line of the log) and at the end. Preparation's stages are timed from the
log's arrival times and its manifest.

Beside them, in the same run:
- SentencePiece's own encoder (`encode(num_threads=N)`) on the first
  `--encoder-pairs` pairs of the corpus, in pairs a second: the limit of
  tokenization, to compare preparation with;
- the training input stream alone (prepared shards -> shuffled, bucketed
  batches of `--stream-batch-tokens`, no model), in target tokens a second,
  in a process pinned to one core and in one on every core;
- the consumption of `transformer_base` on one H100, from
  `results/gpu_training.json` (real tokens a second, half of them target).

Usage:
    python benchmarks/corpus_scale.py --multi30k-dir ../shared/data/multi30k \\
        --sizes 1000000 16000000 --work-dir /tmp/corpus_scale \\
        --output benchmarks/results/corpus_scale.json

Large corpora go under --work-dir (16M pairs take about 4.6 GB of text and
2.5 GB of shards); it is removed at the end unless --keep.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
from benchmarks.common import RESULTS, ROOT, machine, table, write_result  # noqa: E402

# A model small enough that the data path, not the model, is what is measured.
TINY = [
    "--set", "model.preset=null", "--set", "model.num_layers=1", "--set", "model.hidden_dim=64",
    "--set", "model.intermediate_dim=128", "--set", "model.num_heads=2",
]  # fmt: skip


def build_corpus(multi30k_dir, pairs, folder, seed=0):
    """Writes `pairs` lines a side, each two random Multi30k training sentences joined."""
    import numpy as np

    from pipelines.data.corpus import load_multi30k

    train = load_multi30k(multi30k_dir, "train")
    paths = [os.path.join(folder, f"corpus-{pairs}.{side}") for side in ("en", "de")]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    handles = [open(p + ".tmp", "w", encoding="utf-8") for p in paths]
    for start in range(0, pairs, 100_000):
        count = min(100_000, pairs - start)
        first, second = rng.integers(len(train), size=(2, count))
        for side, handle in enumerate(handles):
            handle.write(
                "".join(
                    f"{train[a][side]} {train[b][side]}\n"
                    for a, b in zip(first, second, strict=True)
                )
            )
    for handle, path in zip(handles, paths, strict=True):
        handle.close()
        os.replace(path + ".tmp", path)
    return paths


def peak_kib(pid):
    """The process's peak resident memory so far (VmHWM), in KiB, or None once it has ended."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def train_once(files, out_dir, steps, vocabulary_size, batch_tokens):
    """Runs `kt train` on `files`; returns its peaks, stage times and manifest."""
    command = [
        sys.executable, "-m", "pipelines", "train", "--corpus", "files",
        "--train-files", *files, "--output-dir", out_dir,
        "--steps", str(steps), "--steps-per-epoch", str(steps),
        "--vocabulary-size", str(vocabulary_size), "--batch-tokens", str(batch_tokens),
        "--max-length", "256", "--set", "output.heldout_split=none", *TINY,
    ]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    events, log = {}, []
    peaks = {"preparation": None, "last": 0}

    def watch():
        while process.poll() is None:
            peak = peak_kib(process.pid)
            if peak:
                peaks["last"] = peak
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    marks = {
        "scanned": re.compile(r"pipelines\.data\.scan: .*: [\d,]+ pairs$"),
        "vocabulary_started": re.compile(r"Training a \d+-piece SentencePiece"),
        "tokenizing_done": re.compile(r"Shuffling \d+ shards"),
        "model_built": re.compile(r"Model: [\d,]+ parameters"),
    }
    for line in process.stdout:
        log.append(line)
        for name, pattern in marks.items():
            if name not in events and pattern.search(line.strip()):
                events[name] = round(time.monotonic() - started, 1)
                if name == "model_built":
                    peaks["preparation"] = peak_kib(process.pid)
    process.wait()
    watcher.join()
    events["finished"] = round(time.monotonic() - started, 1)
    if process.returncode:
        raise RuntimeError("kt train failed:\n" + "".join(log[-40:]))
    with open(os.path.join(out_dir, "data", "train", "manifest.json"), encoding="utf-8") as h:
        manifest = json.load(h)
    return {
        "peak_mib_preparation": round(peaks["preparation"] / 1024, 1),
        "peak_mib": round(peaks["last"] / 1024, 1),
        "seconds": events,
        "manifest_seconds": manifest["seconds"],
        "pairs": manifest["corpora"][0]["pairs"],
        "target_tokens": manifest["corpora"][0]["target_tokens"],
        "shards": len(manifest["corpora"][0]["shards"]),
        "shard_bytes": sum(s["bytes"] for s in manifest["corpora"][0]["shards"]),
    }


def encoder_rate(files, spm_path, pairs, threads):
    """SentencePiece's own encoder on the first `pairs` pairs: pairs a second (both sides)."""
    import itertools

    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=spm_path)
    sides = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            sides.append([line.strip() for line in itertools.islice(handle, pairs)])
    started = time.perf_counter()
    for side in sides:
        processor.encode(side, num_threads=threads)
    return pairs / (time.perf_counter() - started)


STREAM_CODE = """
import json, os, sys, time
sys.path.insert(0, {root!r})
cores = {cores!r}
if cores:
    os.sched_setaffinity(0, set(range(cores)))
import tensorflow as tf
from pipelines.data import batching, shards
folder = {folder!r}
manifest = shards.read_manifest(folder)
examples = shards.read_examples(manifest, folder, shuffle=True, seed=0)
dataset = batching.batch_examples(examples, {batch_tokens}, 256, shuffle=True, repeat=True,
                                  cache=False)
if cores:
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    dataset = dataset.with_options(options)
iterator = iter(dataset)
for _ in range(20):  # the shuffle buffer fills
    next(iterator)
tokens, started = 0, time.perf_counter()
while time.perf_counter() - started < {seconds}:
    (_, _), labels = next(iterator)
    tokens += int(tf.math.count_nonzero(labels))
print(json.dumps({{"target_tokens_per_second": tokens / (time.perf_counter() - started)}}))
"""


def stream_rate(folder, cores, batch_tokens, seconds):
    """The training input stream from shards alone: target tokens a second on `cores` cores."""
    code = STREAM_CODE.format(
        root=ROOT, cores=cores, folder=folder, batch_tokens=batch_tokens, seconds=seconds
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["target_tokens_per_second"]


def gpu_consumption():
    """Target tokens a second `transformer_base` trains on one H100 (our last GPU figure)."""
    path = os.path.join(RESULTS, "gpu_training.json")
    with open(path, encoding="utf-8") as handle:
        gpu = json.load(handle)
    ours = gpu["results"]["transformer_base"]["ours"]
    return {
        "device": gpu["device"],
        "date": gpu["machine"]["date"],
        "real_tokens_per_second": ours["real_tokens_per_second"],
        "target_tokens_per_second": ours["real_tokens_per_second"] / 2,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 16_000_000])
    parser.add_argument("--work-dir", default="/tmp/corpus_scale")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--encoder-pairs", type=int, default=200_000)
    parser.add_argument("--stream-batch-tokens", type=int, default=25_000)
    parser.add_argument("--stream-seconds", type=float, default=30.0)
    parser.add_argument("--keep", action="store_true", help="keep the corpora and runs")
    parser.add_argument("--output", default=os.path.join(RESULTS, "corpus_scale.json"))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    runs = {}
    for size in args.sizes:
        files = build_corpus(args.multi30k_dir, size, args.work_dir)
        out_dir = os.path.join(args.work_dir, f"run-{size}")
        shutil.rmtree(out_dir, ignore_errors=True)
        run = train_once(files, out_dir, args.steps, args.vocabulary_size, args.batch_tokens)
        prepared = sum(run["manifest_seconds"].values())
        run["preparation_pairs_per_second"] = round(run["pairs"] / prepared, 1)
        run["all_preparation_seconds"] = run["seconds"]["model_built"]
        runs[size] = run
        print(f"{size:,} pairs: {json.dumps(run)}", flush=True)
    smallest, largest = min(args.sizes), max(args.sizes)
    files = build_corpus(args.multi30k_dir, smallest, args.work_dir)
    spm_path = os.path.join(args.work_dir, f"run-{smallest}", "sentencepiece.model")
    cores = os.cpu_count()
    encoder = encoder_rate(files, spm_path, args.encoder_pairs, cores)
    folder = os.path.join(args.work_dir, f"run-{smallest}", "data", "train")
    stream = {
        "one_core": stream_rate(folder, 1, args.stream_batch_tokens, args.stream_seconds),
        "all_cores": stream_rate(folder, None, args.stream_batch_tokens, args.stream_seconds),
    }
    for run in runs.values():  # the encoder's rate on the smallest corpus's lines: the same kind
        run["preparation_over_encoder"] = round(run["preparation_pairs_per_second"] / encoder, 3)
    gpu = gpu_consumption()
    result = {
        "benchmark": "corpus_scale",
        "machine": machine(),
        "command": "python benchmarks/corpus_scale.py " + " ".join(sys.argv[1:]),
        "runs": {str(size): run for size, run in runs.items()},
        "peak_ratio_largest_to_smallest": round(
            runs[largest]["peak_mib"] / runs[smallest]["peak_mib"], 3
        ),
        "sentencepiece_encoder_pairs_per_second": round(encoder, 1),
        "stream_target_tokens_per_second": {k: round(v) for k, v in stream.items()},
        "stream_target_tokens_per_second_per_core": round(stream["one_core"]),
        "gpu_consumption": gpu,
        "cores_to_feed_one_h100": round(gpu["target_tokens_per_second"] / stream["one_core"], 2),
    }
    write_result(result, args.output)
    rows = [
        [f"{size:,}", r["peak_mib_preparation"], r["peak_mib"], r["preparation_pairs_per_second"],
         r["all_preparation_seconds"]]
        for size, r in runs.items()
    ]  # fmt: skip
    print(table(["pairs", "peak MiB (prep)", "peak MiB", "prep pairs/s", "to first step s"], rows))
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine")}, indent=1))
    if not args.keep:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
