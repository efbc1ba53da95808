"""What the benchmarks share: environment, results JSON, tables."""

import datetime
import json
import os
import platform
import statistics

# The product's recommended setting on these CPUs (README, Makefile); it must
# be set before TensorFlow is imported.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def machine():
    """Where the numbers come from."""
    import tensorflow as tf

    return {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "tensorflow": tf.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
    }


def median(values):
    return statistics.median(values) if values else None


def write_result(result, path):
    """Writes `result` plus `machine()` as JSON to `path`; returns the dict written."""
    result = {"machine": machine(), **result}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    return result


def table(header, rows):
    """A Markdown table of `rows` (lists of cells) under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
