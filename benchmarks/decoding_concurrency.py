"""Decoding with one or two batches in flight: SavedModel chunks and requests, CTranslate2.

Usage:
    python benchmarks/decoding_concurrency.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 7] [--intra-op-threads 1]

On a machine of few cores, a search step's ops are small, and two batches
searched at once could keep the cores busier than one batch whose every op
is split over them. This measures both engines both ways on
test_2016_flickr, greedy and beam 4, in the same length-sorted batches of
`--batch-size`:
- `saved_model_chunks1`: the SavedModel as exported, all sentences in one
  request (its graph searches one chunk of it at a time);
- `saved_model_chunks2`: the same with two chunks in flight (an export whose
  chunks' loop runs at `parallel_iterations=2`);
- `saved_model_requests1`: the export, one request a batch, one after
  another;
- `saved_model_requests2`: the same requests from two client threads, two
  in flight, as a server with two clients runs them;
- `ctranslate2_1xT`: CTranslate2, one batch at a time on all T threads (as
  benchmarks/decoding.py runs it);
- `ctranslate2_2xT/2`: two batches at once.
`--intra-op-threads` sets TensorFlow's threads for one op (its default: one
a core), as TF Serving's `--tensorflow_intra_op_parallelism` does.
Each repetition runs every decoder once, in turn; the figure is the median.
Writes benchmarks/results/decoding_concurrency.json: seconds, sentences/s,
and how many translations match `saved_model_chunks1`'s.
"""

import argparse
import functools
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    load_run,
    median,
    read_parallel,
    table,
    time_cases,
    write_result,
)


def length_sorted_batches(pieces, batch_size):
    """Row indices in batches of `batch_size`, by piece count as the graph sorts them.

    Args:
        pieces: list of int, each sentence's piece count.
        batch_size: int.

    Returns:
        list of lists of int.
    """
    order = sorted(range(len(pieces)), key=lambda i: pieces[i])  # stable, as tf.argsort
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def requests_in_flight(signature, batches, lines, in_flight):
    """`translate(beam) -> list of str`: one request a batch of `lines`, `in_flight` at once."""
    from pipelines.serving.client import translate_lines

    pool = ThreadPoolExecutor(in_flight)

    def request(rows, beam):  # the whole batch in one call
        return translate_lines(signature, [lines[i] for i in rows], beam, 0.6, len(rows))[0]

    def translate(beam):
        translations = [None] * len(lines)
        done = pool.map(lambda rows: request(rows, beam), batches)
        for rows, texts in zip(batches, done, strict=True):
            for row, text in zip(rows, texts, strict=True):
                translations[row] = text
        return translations

    return translate


def build_decoders(run_dir, work_dir, batch_size, sources):
    """`{name: translate(beam_size) -> list of str}`, each translating `sources`."""
    import sentencepiece
    import tensorflow as tf

    from pipelines.serving import saved_model, translation
    from pipelines.serving.client import translate_lines
    from pipelines.serving.ctranslate2 import CTranslate2Translator, convert

    model, max_length = load_run(run_dir)
    spm_path = os.path.join(run_dir, "sentencepiece.model")
    decoders, signatures = {}, {}
    lines = [s.encode("utf-8") for s in sources]
    one_at_a_time = translation.by_length_chunks
    for chunks in (1, 2):
        # The export traces `translate_strings`, which looks the chunking up in
        # its module: the variant is in place only while it is traced.
        translation.by_length_chunks = functools.partial(one_at_a_time, parallel_chunks=chunks)
        try:
            translator = saved_model.Translator(
                model, spm_path, max_length, chunk_size=batch_size, signatures=["translate"]
            )
            path = saved_model.export(translator, os.path.join(work_dir, f"chunks{chunks}"))
        finally:
            translation.by_length_chunks = one_at_a_time
        signatures[chunks] = signature = tf.saved_model.load(path).signatures["translate"]
        decoders[f"saved_model_chunks{chunks}"] = functools.partial(
            lambda signature, beam: translate_lines(signature, lines, beam, 0.6)[0], signature
        )
    pieces = sentencepiece.SentencePieceProcessor(model_file=spm_path).encode(sources)
    batches = length_sorted_batches([len(p) for p in pieces], batch_size)
    for in_flight in (1, 2):
        decoders[f"saved_model_requests{in_flight}"] = requests_in_flight(
            signatures[1], batches, lines, in_flight
        )
    ct2_path = convert(model, spm_path, os.path.join(work_dir, "ct2"), max_length)
    threads = os.cpu_count() or 1
    for inter in (1, 2):
        ct2 = CTranslate2Translator(ct2_path, threads=max(threads // inter, 1), inter_threads=inter)
        decoders[f"ctranslate2_{inter}x{max(threads // inter, 1)}"] = functools.partial(
            lambda ct2, beam: ct2.translate(sources, beam, 0.6, batch_size)[0], ct2
        )
    return decoders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences searched at once")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--intra-op-threads", type=int, help="TensorFlow's threads for one op (default: its own)"
    )
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding_concurrency.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "test_2016_flickr")
    if args.intra_op_threads:
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
        except RuntimeError:  # TensorFlow already started in this process
            parser.error("--intra-op-threads must be set before TensorFlow runs anything")

    with tempfile.TemporaryDirectory() as work_dir:
        decoders = build_decoders(args.run_dir, work_dir, args.batch_size, sources)
        cases = [(name, beam) for beam in args.beams for name in decoders]
        seconds, outputs = time_cases(lambda case: decoders[case[0]](case[1]), cases, args.repeats)

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
            "intra_op_threads": args.intra_op_threads,
            "repeats": args.repeats,
            "results": results,
        },
        args.output,
    )
    print(table(["decoder", "beam", "sentences/s", "same as saved_model_chunks1"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
