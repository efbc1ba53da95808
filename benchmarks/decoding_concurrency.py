"""Decoding with two batches in flight: the SavedModel's chunks and CTranslate2's threads.

Usage:
    python benchmarks/decoding_concurrency.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 7]

On a machine of few cores, a search step's ops are small, and two batches
searched at once could keep the cores busier than one batch whose every op
is split over them. This measures both engines both ways on
test_2016_flickr, greedy and beam 4, batches of `--batch-size`:
- `saved_model_chunks1`: the SavedModel as exported (its graph searches one
  chunk of a request at a time);
- `saved_model_chunks2`: the same export with two chunks in flight (the
  chunks' loop at `parallel_iterations=2`: two chunks' caches at once);
- `ctranslate2_1x2`: CTranslate2, one batch at a time on all threads (as
  benchmarks/decoding.py runs it);
- `ctranslate2_2x1`: two batches at once, one thread each.
Each repetition runs every decoder once, in turn; the figure is the median.
Writes benchmarks/results/decoding_concurrency.json: seconds, sentences/s,
and how many translations match the SavedModel's as exported.
"""

import argparse
import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    load_run,
    median,
    read_parallel,
    table,
    write_result,
)


def build_decoders(run_dir, work_dir, batch_size):
    """`{name: translate(beam_size) -> list of str}` over the sentences given to each."""
    import tensorflow as tf

    from pipelines.serving import saved_model, translation
    from pipelines.serving.client import translate_lines
    from pipelines.serving.ctranslate2 import CTranslate2Translator, convert

    model, max_length = load_run(run_dir)
    spm_path = os.path.join(run_dir, "sentencepiece.model")
    decoders = {}
    one_at_a_time = translation.by_length_chunks
    for chunks in (1, 2):
        # The export traces `translate_strings`, which looks the chunking up in
        # its module: the variant is in place only while it is traced.
        translation.by_length_chunks = functools.partial(one_at_a_time, parallel_chunks=chunks)
        try:
            translator = saved_model.Translator(model, spm_path, max_length, chunk_size=batch_size)
            path = saved_model.export(translator, os.path.join(work_dir, f"chunks{chunks}"))
        finally:
            translation.by_length_chunks = one_at_a_time
        signature = tf.saved_model.load(path).signatures["translate"]
        decoders[f"saved_model_chunks{chunks}"] = functools.partial(
            lambda signature, lines, beam: translate_lines(signature, lines, beam, 0.6)[0],
            signature,
        )
    ct2_path = convert(model, spm_path, os.path.join(work_dir, "ct2"), max_length)
    threads = os.cpu_count() or 1
    for inter in (1, 2):
        ct2 = CTranslate2Translator(ct2_path, threads=max(threads // inter, 1), inter_threads=inter)
        decoders[f"ctranslate2_{inter}x{max(threads // inter, 1)}"] = functools.partial(
            lambda ct2, sentences, beam: ct2.translate(sentences, beam, 0.6, batch_size)[0], ct2
        )
    return decoders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences searched at once")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding_concurrency.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "test_2016_flickr")
    lines = [s.encode("utf-8") for s in sources]

    with tempfile.TemporaryDirectory() as work_dir:
        decoders = build_decoders(args.run_dir, work_dir, args.batch_size)
        inputs = {name: lines if name.startswith("saved_model") else sources for name in decoders}
        cases = [(name, beam) for beam in args.beams for name in decoders]
        for name, beam in cases:  # loading and tracing, not timed
            decoders[name](inputs[name][:8], beam)
        seconds = {case: [] for case in cases}
        outputs = {}
        for _ in range(args.repeats):
            for name, beam in cases:
                started = time.perf_counter()
                outputs[name, beam] = decoders[name](inputs[name], beam)
                seconds[name, beam].append(time.perf_counter() - started)

    results, rows = {}, []
    for name, beam in cases:
        reference = outputs["saved_model_chunks1", beam]
        same = sum(a == b for a, b in zip(outputs[name, beam], reference, strict=True))
        middle = median(seconds[name, beam])
        results[f"{name}_beam{beam}"] = {
            "median_seconds": round(middle, 3),
            "seconds": [round(s, 3) for s in seconds[name, beam]],
            "sentences_per_second": round(len(sources) / middle, 1),
            "same_as_saved_model_chunks1": same,
        }
        rows.append([name, beam, f"{len(sources) / middle:.1f}", f"{same}/{len(sources)}"])
    command = "python benchmarks/decoding_concurrency.py " + " ".join(argv or sys.argv[1:])
    write_result(
        {
            "benchmark": "decoding_concurrency",
            "command": command,
            "run_dir": os.path.abspath(args.run_dir),
            "source": args.source,
            "sentences": len(sources),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "results": results,
        },
        args.output,
    )
    print(table(["decoder", "beam", "sentences/s", "same as saved_model_chunks1"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
