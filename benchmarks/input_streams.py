"""The training input stream's rate and memory with one and with several input streams.

A synthetic corpus of `--pairs` pairs (Multi30k's training lines joined two
by two, about 140 characters a side, like WMT's; `corpus_scale.build_corpus`)
is prepared once for `max(--streams)` streams. Then, for each stream count
in turn and `--repeats` times side by side, a process of its own reads the
run's training batches (`parallel.training_batches`: shards -> shuffled,
length-bucketed batches of `--batch-tokens`, no model) for `--seconds`
seconds after the shuffle buffers fill, counting real target tokens; its
peak resident memory (`VmHWM`) and the CPU time it used are read as it
ends, and every batch is checked against the token budget. Then one stream
in a process pinned to one core: the rate a core gives when no hand-off
between the stream's threads crosses cores. With --service, last, the
largest stream count on a local tf.data service (`kt data-service`), one
worker process pinned to each core, read by an unpinned process.

Usage:
    python benchmarks/input_streams.py --multi30k-dir ../shared/data/multi30k \\
        --work-dir /tmp/input_streams --service --output benchmarks/results/input_streams.json

The work folder (about 0.2 GB at 500,000 pairs) is removed at the end
unless --keep.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
from benchmarks.common import ROOT, machine, median, table, write_result  # noqa: E402
from benchmarks.corpus_scale import build_corpus, peak_kib  # noqa: E402

READ_CODE = """
import json, os, resource, sys, time
sys.path.insert(0, {root!r})
if {pinned!r}:
    os.sched_setaffinity(0, {{0}})
import tensorflow as tf
from pipelines.data import shards
from pipelines.training.loading import load_config
from pipelines.training.parallel import training_batches
config = load_config(config_file={config!r}, settings={{"input_streams": {streams},
                                                       "data_service": {service!r}}})
folder = {folder!r}
dataset = training_batches(config, shards.read_manifest(folder), folder, 0, 1, {batch_tokens})
iterator = iter(dataset)
for _ in range({warm_up}):  # the shuffle buffers fill
    next(iterator)
tokens, batches, over, started = 0, 0, 0, time.perf_counter()
before = resource.getrusage(resource.RUSAGE_SELF)
while time.perf_counter() - started < {seconds}:
    (sources, target_inputs), labels = next(iterator)
    tokens += int(tf.math.count_nonzero(labels))
    batches += 1
    over += int(tf.size(sources) > {batch_tokens} or tf.size(labels) > {batch_tokens})
seconds = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
print(json.dumps({{"target_tokens_per_second": tokens / seconds, "batches": batches,
                  "over_budget": over, "peak_mib": peak / 1024, "cores_busy": cpu / seconds,
                  "cpu_microseconds_per_target_token": 1e6 * cpu / tokens}}))
"""


def prepare(files, out_dir, streams, vocabulary_size):
    """Prepares the corpus's shards for `streams` streams; returns `(config_path, train_dir)`."""
    from pipelines.files import write_json
    from pipelines.training import data
    from pipelines.training.loading import load_config

    config = load_config(
        "default",
        settings={
            "corpus": "files",
            "train_files": files,
            "output_dir": out_dir,
            "input_streams": streams,
            "vocabulary_size": vocabulary_size,
        },
    )
    data.prepare_data(config, out_dir)
    path = os.path.join(out_dir, "config.json")
    write_json(path, config.to_dict())
    return path, os.path.join(out_dir, "data", "train")


def read_rate(
    config_path, folder, streams, batch_tokens, seconds, warm_up, pinned=False, service=None
):
    """One process reading `streams` streams: its rate, batches, budget breaches and peak MiB.

    `pinned`: the process runs on one core only; `service`: the streams run on that
    tf.data service's workers.
    """
    code = READ_CODE.format(
        root=ROOT, config=config_path, folder=folder, streams=streams, service=service,
        batch_tokens=batch_tokens, seconds=seconds, warm_up=warm_up, pinned=pinned,
    )  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port():
    with socket.socket() as handle:
        handle.bind(("localhost", 0))
        return handle.getsockname()[1]


def service_rate(config_path, folder, streams, batch_tokens, seconds, warm_up):
    """`streams` streams on a local tf.data service, one `kt data-service` worker a core.

    Each worker process is pinned to a core of its own, so its stream's threads never hand
    batches across cores; the reading process is not pinned. Returns `read_rate`'s dict
    with the workers' peak MiB.
    """
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    kt = [sys.executable, "-m", "pipelines", "data-service"]
    port = free_port()
    servers = [subprocess.Popen([*kt, "dispatcher", "--port", str(port)], cwd=ROOT, env=env)]
    cores = sorted(os.sched_getaffinity(0))
    for index in range(streams):
        core = cores[index % len(cores)]
        worker = [*kt, "worker", "--dispatcher", f"localhost:{port}", "--port",
                  str(free_port()), "--host", "localhost"]  # fmt: skip
        servers.append(
            subprocess.Popen(
                worker, cwd=ROOT, env=env, preexec_fn=lambda c=core: os.sched_setaffinity(0, {c})
            )
        )
    try:
        time.sleep(15)  # the servers import TensorFlow and register
        run = read_rate(
            config_path, folder, streams, batch_tokens, seconds, warm_up,
            service=f"grpc://localhost:{port}",
        )  # fmt: skip
        run["worker_peak_mib"] = [peak_kib(server.pid) / 1024 for server in servers[1:]]
        return run
    finally:
        for server in servers:
            server.kill()
            server.wait()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--work-dir", default="/tmp/input_streams")
    parser.add_argument("--pairs", type=int, default=500_000)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-tokens", type=int, default=25_000)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warm-up", type=int, default=40, help="batches read before timing")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--service", action="store_true", help="also the streams on a local tf.data service"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--output", default=None)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    files = build_corpus(args.multi30k_dir, args.pairs, args.work_dir)
    out_dir = os.path.join(args.work_dir, "run")
    shutil.rmtree(out_dir, ignore_errors=True)
    config_path, folder = prepare(files, out_dir, max(args.streams), args.vocabulary_size)
    measured = {streams: [] for streams in args.streams}
    for _ in range(args.repeats):  # side by side: each count once a round
        for streams in args.streams:
            run = read_rate(
                config_path, folder, streams, args.batch_tokens, args.seconds, args.warm_up
            )
            measured[streams].append(run)
            print(f"{streams} streams: {json.dumps(run)}", flush=True)
    # One stream on one core: what a core gives where the stream's threads never hand
    # batches across cores.
    pinned = read_rate(config_path, folder, 1, args.batch_tokens, args.seconds, args.warm_up, True)
    print(f"1 stream on one core: {json.dumps(pinned)}", flush=True)
    served = None
    if args.service:
        served = service_rate(
            config_path, folder, max(args.streams), args.batch_tokens, args.seconds, args.warm_up
        )
        print(f"{max(args.streams)} streams on a local service: {json.dumps(served)}", flush=True)
    cores = os.cpu_count()
    one = min(args.streams)
    rates = {
        s: median([r["target_tokens_per_second"] for r in runs]) for s, runs in measured.items()
    }
    peaks = {s: max(r["peak_mib"] for r in runs) for s, runs in measured.items()}
    result = {
        "benchmark": "input_streams",
        "command": "python benchmarks/input_streams.py " + " ".join(sys.argv[1:]),
        "pairs": args.pairs,
        "batch_tokens": args.batch_tokens,
        "cores": cores,
        "runs": {str(s): runs for s, runs in measured.items()},
        "target_tokens_per_second": {str(s): round(rate) for s, rate in rates.items()},
        "speedup_over_one_stream": {str(s): round(rates[s] / rates[one], 3) for s in rates},
        "peak_mib": {str(s): round(peak, 1) for s, peak in peaks.items()},
        "peak_ratio_over_one_stream": {str(s): round(peaks[s] / peaks[one], 3) for s in peaks},
        "target_tokens_per_second_per_core": {str(s): round(rates[s] / cores) for s in rates},
        "batches_over_budget": sum(r["over_budget"] for runs in measured.values() for r in runs),
        "one_stream_on_one_core": pinned,
        "service": served
        and {
            **served,
            "streams": max(args.streams),
            "over_one_stream": round(served["target_tokens_per_second"] / rates[one], 3),
        },
    }
    if args.output:
        write_result(result, args.output)
    else:
        result = {"machine": machine(), **result}
    rows = [
        [s, f"{round(rates[s]):,}", result["speedup_over_one_stream"][str(s)],
         result["peak_mib"][str(s)], result["peak_ratio_over_one_stream"][str(s)]]
        for s in args.streams
    ]  # fmt: skip
    print(table(["streams", "target tokens/s", "x one stream", "peak MiB", "x one"], rows))
    if not args.keep:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
