"""What the benchmarks share: environment, results JSON, tables."""

import datetime
import os
import platform
import statistics
import time

# The product's recommended setting on these CPUs (README, Makefile); it must
# be set before TensorFlow is imported.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """`(model name, vector extensions)` of the CPU, from Linux's `cpuinfo`.

    Time-budgeted recipes train as many updates as the machine allows (the
    same recipe ran 0.34 s a step on one 2-core machine and 0.67 s on
    another), so every result names the CPU. Falls back to `platform` where
    the file is missing; the standard library has no portable way to read
    the model name or the instruction sets.

    Returns:
        `(str, list of str)`: the model name, and which of AVX2, AVX-512
        (foundation), AVX-512 VNNI and AMX the flags list.
    """
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            fields = dict(
                (key.strip(), value.strip())
                for key, _, value in (line.partition(":") for line in handle)
                if value
            )
    except OSError:
        return platform.processor() or platform.machine(), []
    flags = set(fields.get("flags", "").split())
    names = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI", "amx_tile": "AMX"}
    extensions = [name for flag, name in names.items() if flag in flags]
    return fields.get("model name", platform.machine()), extensions


def machine():
    """Where the numbers come from (TensorFlow's version where it is installed)."""
    model, extensions = cpu_model()
    stamp = {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu": model,
        "vector_extensions": extensions,
    }
    try:
        import tensorflow as tf
    except ImportError:  # the GPU benchmarks run where only JAX is installed
        return stamp
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return {**stamp, "tensorflow": tf.__version__, "onednn": onednn}


def folder_bytes(path):
    """Bytes of every file under `path`."""
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )


def median(values):
    return statistics.median(values) if values else None


def time_cases(run, cases, repeats, warm_up=None, after_repeat=None):
    """Times `run(case)` for every case, the cases interleaved.

    Each case is warmed up untimed first (loading, tracing); then each of
    `repeats` repetitions runs every case once, in turn, so a slow spell of
    the machine falls on all cases alike. Quote the median of each case.

    Args:
        run: callable, `run(case)` -> the case's output.
        cases: list of hashable cases.
        repeats: int, timed runs of each case.
        warm_up: callable `warm_up(case)`, or None to run each case once.
        after_repeat: callable `after_repeat(seconds, outputs)` called after
            each repetition (to print or save what was measured), or None.

    Returns:
        `({case: [seconds]}, {case: output of its last run})`.
    """
    for case in cases:
        (warm_up or run)(case)
    seconds, outputs = {case: [] for case in cases}, {}
    for _ in range(repeats):
        for case in cases:
            started = time.perf_counter()
            outputs[case] = run(case)
            seconds[case].append(time.perf_counter() - started)
        if after_repeat is not None:
            after_repeat(seconds, outputs)
    return seconds, outputs


def write_result(result, path):
    """Writes `result` plus `machine()` as JSON to `path`; returns the dict written."""
    result = {"machine": machine(), **result}
    from pipelines.files import prepare_output_file, write_json

    prepare_output_file(path, "--output")
    write_json(path, result)
    return result


def table(header, rows):
    """A Markdown table of `rows` (lists of cells) under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def add_parallel_arguments(parser, split):
    """`--multi30k-dir` (reads Multi30k's `split`), or `--source` and `--reference`."""
    parser.add_argument("--multi30k-dir", help=f"reads {split}.{{en,de}}.gz from here")
    parser.add_argument("--source", help="source sentences (instead of --multi30k-dir)")
    parser.add_argument("--reference", help="reference translations, aligned with --source")


def read_parallel(parser, args, split):
    """`(sources, references)`, lists of str, from the arguments `add_parallel_arguments` adds.

    Sets `args.source` and `args.reference` to the files read.
    """
    from pipelines.data.corpus import read_lines

    if args.multi30k_dir:
        args.source = args.source or os.path.join(args.multi30k_dir, f"{split}.en.gz")
        args.reference = args.reference or os.path.join(args.multi30k_dir, f"{split}.de.gz")
    if not args.source or not args.reference:
        parser.error("give --multi30k-dir, or --source and --reference")
    return read_lines(args.source), read_lines(args.reference)


def load_run(run_dir):
    """`(model, max_length)`: a training run's model and its longest source, in tokens."""
    import keras

    import keras_transformer  # noqa: F401  registers the model classes
    from pipelines.training.recorded import run_max_length

    model = keras.saving.load_model(os.path.join(run_dir, "model.keras"))
    return model, run_max_length(run_dir)


def export_run(run_dir, base_dir, signatures=None):
    """Exports a training run as a SavedModel under `base_dir`; returns the version folder.

    `signatures` (list of names, None for all) are the ones the benchmark calls.
    """
    from pipelines.serving import saved_model

    model, max_length = load_run(run_dir)
    spm_path = os.path.join(run_dir, "sentencepiece.model")
    translator = saved_model.Translator(model, spm_path, max_length, signatures=signatures)
    return saved_model.export(translator, base_dir)


def stage_environment():
    """The environment of the `kt` stages a recipe benchmark runs (`run_stage`).

    TensorFlow, quiet, with this process's oneDNN setting (set on import above).
    """
    return {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}


def set_flags(values):
    """`--set` flags for a list of `key=value` items: ["--set", item, ...]."""
    return [flag for value in values for flag in ("--set", value)]


def write_multi30k_split(multi30k_dir, split, folder, sentences=None):
    """Writes the first `sentences` lines of a Multi30k split as plain `en` and `de` files.

    Returns:
        `(source_path, reference_path, lines_written)`.
    """
    from pipelines.data.corpus import read_lines

    paths = []
    for language in ("en", "de"):
        path = os.path.join(folder, f"{split}.{language}")
        lines = read_lines(os.path.join(multi30k_dir, f"{split}.{language}.gz"))[:sentences]
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(f"{line}\n" for line in lines)
        paths.append(path)
    return paths[0], paths[1], len(lines)
