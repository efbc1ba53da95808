"""Scoring given translations through the SavedModel against translating the same sources.

Usage:
    python benchmarks/scoring.py --run-dir runs/multi30k --multi30k-dir ../shared/data/multi30k
    python benchmarks/scoring.py --run-dir runs/demo --source S --reference R

Exports the run as a SavedModel and, in this process, times its `score`
signature on (source, reference) pairs against its `translate` signature on
the same sources, with beam 4 and with greedy search: `--batch-size` pairs a
call, each pass once per repetition, alternating which goes first; the
median of `--repeats`. Scoring is one teacher-forced pass a chunk; a search
takes one decoder step a target position. Writes
benchmarks/results/scoring.json.
"""

import argparse
import os
import sys
import tempfile
import time

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


def timed(call, sources, targets, batch_size):
    """Seconds for `call(sources, targets)` over the pairs, `batch_size` at a time."""
    started = time.perf_counter()
    for start in range(0, len(sources), batch_size):
        call(sources[start : start + batch_size], targets[start : start + batch_size])
    return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--batch-size", type=int, default=128, help="pairs per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(RESULTS, "scoring.json"))
    args = parser.parse_args(argv)
    sources, references = read_parallel(parser, args, "test_2016_flickr")

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as work_dir:
        version = export_run(args.run_dir, work_dir, ["score", "translate"])
        signatures = tf.saved_model.load(version).signatures

        def score(batch, targets):
            return signatures["score"](sources=tf.constant(batch), targets=tf.constant(targets))

        def translate(beam):
            def call(batch, _):
                return signatures["translate"](
                    inputs=tf.constant(batch),
                    beam_size=tf.constant(beam),
                    alpha=tf.constant(0.6),
                    penalty_form=tf.constant(""),
                )

            return call

        passes = {"score": score, "beam4": translate(4), "greedy": translate(1)}
        for call in passes.values():  # trace and warm up
            call(sources[:8], references[:8])
        seconds = {name: [] for name in passes}
        for repeat in range(args.repeats):
            order = list(passes) if repeat % 2 == 0 else list(passes)[::-1]
            for name in order:
                seconds[name].append(timed(passes[name], sources, references, args.batch_size))
    rates = {name: len(sources) / median(values) for name, values in seconds.items()}
    result = write_result(
        {
            "benchmark": "scoring",
            "command": "python benchmarks/scoring.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "pairs": len(sources),
            "batch_size": args.batch_size,
            "seconds": {name: [round(s, 3) for s in values] for name, values in seconds.items()},
            "pairs_per_second": {name: round(rate, 1) for name, rate in rates.items()},
            "score_over_beam4": round(rates["score"] / rates["beam4"], 2),
            "score_over_greedy": round(rates["score"] / rates["greedy"], 2),
        },
        args.output,
    )
    rows = [[name, f"{rate:.1f}"] for name, rate in rates.items()]
    print(table(["pass", "pairs / s"], rows))
    print(f"scoring / beam 4: {result['score_over_beam4']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
