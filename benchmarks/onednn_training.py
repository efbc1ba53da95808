"""Training throughput of the default recipe with TensorFlow's oneDNN kernels on and off.

Usage:
    python benchmarks/onednn_training.py [--repeats 3] [--steps 150]

TensorFlow leaves oneDNN off on AMD CPUs unless TF_ENABLE_ONEDNN_OPTS=1. Each
repetition runs the training command twice, once per setting, alternating
which goes first; the figure is the steady-state tokens per second of the last
epoch (the first epoch holds tracing). Prints a table and writes
benchmarks/results/onednn_training.json with the medians and their ratio.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def tokens_per_second(onednn, steps):
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1" if onednn else "0"}
        env.update(TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
        command = [sys.executable, "-m", "pipelines", "train", "--output-dir", out,
                   "--steps", str(steps), "--steps-per-epoch", str(steps // 3),
                   "--set", "default_corpus_sizes=[5000,100,100]"]  # fmt: skip
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
        with open(os.path.join(out, "result.json"), encoding="utf-8") as handle:
            return json.load(handle)["history"]["tokens_per_second"][-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--output", default="benchmarks/results/onednn_training.json")
    args = parser.parse_args()
    runs = {False: [], True: []}
    for repeat in range(args.repeats):
        for onednn in (repeat % 2 == 0, repeat % 2 == 1):
            runs[onednn].append(tokens_per_second(onednn, args.steps))
            print(f"repeat {repeat}, oneDNN {'on ' if onednn else 'off'}: "
                  f"{runs[onednn][-1]:.0f} tokens/s", flush=True)  # fmt: skip
    off, on = statistics.median(runs[False]), statistics.median(runs[True])
    result = {
        "tokens_per_second_onednn_off": runs[False],
        "tokens_per_second_onednn_on": runs[True],
        "median_off": off,
        "median_on": on,
        "speedup": round(on / off, 3),
        "steps": args.steps,
        "cpus": os.cpu_count(),
    }
    print(f"| oneDNN | tokens/s (median of {args.repeats}) |\n|---|---|")
    print(f"| off | {off:.0f} |\n| on | {on:.0f} |\nspeedup {on / off:.2f}x")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
