"""int8 SavedModels against float32, and CTranslate2 int8 on the same weights.

Usage:
    python benchmarks/int8_serving.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 5]

Exports the run three times (`kt export` with no `--quantize`, `--quantize
int8` and `--quantize int8-weights`) and translates test_2016_flickr (1,000
sentences) with each export's `translate` signature, greedy and beam 4
(alpha 0.6), in length-sorted requests of `--batch-size` sentences: one
request at a time, and two in flight from two client threads. CTranslate2
translates the same batches from the run's weights converted by
`pipelines.serving.ctranslate2`, with `compute_type` int8 and float32, one
batch at a time on all cores and two at once on half each. Each repetition
runs every case once, in turn; the figure is the median. Then each export
translates each of `--large` sentence counts (the test sentences, repeated) in
one request in a fresh process (benchmarks/request_size.py's client), which
reports its resident memory after loading and its peak.

Targets (benchmarks/README.md): int8 at least 1.3x float32's speed, greedy
and beam 4, one and two in flight, BLEU within 0.5; against CTranslate2
int8, reported as a ratio (the goal: within 1.5x); peak memory of the large
request no worse than float32's, at each size. `--memory-only` exports and
measures the large requests alone. Writes benchmarks/results/int8_serving.json
(int8_serving_memory.json with `--memory-only`).
"""

import argparse
import functools
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    folder_bytes,
    load_run,
    median,
    read_parallel,
    table,
    time_cases,
    write_result,
)
from benchmarks.decoding_concurrency import (  # noqa: E402
    length_sorted_batches,
    requests_in_flight,
)
from benchmarks.request_size import LOADERS, run_client  # noqa: E402

EXPORTS = ("float32", "int8", "int8-weights")


def export_versions(model, spm_path, max_length, work_dir, batch_size, signatures=None):
    """`{export: version folder}`: the model exported as each of `EXPORTS` under `work_dir`.

    `signatures`: what each export holds besides `translate` and `serving_default`;
    None exports all, as `kt export` does."""
    from pipelines.serving import saved_model

    if signatures is not None:
        signatures = ["translate", "serving_default", *signatures]
    versions = {}
    for name in EXPORTS:
        quantize = None if name == "float32" else name
        translator = saved_model.Translator(
            model, spm_path, max_length, chunk_size=batch_size, quantize=quantize,
            signatures=signatures,
        )  # fmt: skip
        versions[name] = saved_model.export(translator, os.path.join(work_dir, name))
    return versions


def build_decoders(model, spm_path, max_length, work_dir, batch_size, sources, signatures=None):
    """`{name: translate(beam_size) -> list of str}` and `{export: version folder}`.

    `signatures`: what each export holds besides `translate` and `serving_default`
    (which the benchmark calls); None exports all, as `kt export` does."""
    import sentencepiece
    import tensorflow as tf

    from pipelines.serving.ctranslate2 import CTranslate2Translator, convert

    lines = [s.encode("utf-8") for s in sources]
    pieces = sentencepiece.SentencePieceProcessor(model_file=spm_path).encode(sources)
    batches = length_sorted_batches([len(p) for p in pieces], batch_size)
    decoders = {}
    versions = export_versions(model, spm_path, max_length, work_dir, batch_size, signatures)
    for name in EXPORTS:
        signature = tf.saved_model.load(versions[name]).signatures["translate"]
        for in_flight in (1, 2):
            decoders[f"{name}_{in_flight}"] = requests_in_flight(
                signature, batches, lines, in_flight
            )
    ct2_path = convert(model, spm_path, os.path.join(work_dir, "ct2"), max_length)
    threads = os.cpu_count() or 1
    ordered = [sources[i] for rows in batches for i in rows]
    order = [i for rows in batches for i in rows]

    def in_input_order(ct2, beam):
        texts = ct2.translate(ordered, beam, 0.6, batch_size)[0]
        translations = [None] * len(sources)
        for row, text in zip(order, texts, strict=True):
            translations[row] = text
        return translations

    for compute_type in ("int8", "float32"):
        for inter in (1, 2):
            ct2 = CTranslate2Translator(
                ct2_path, max(threads // inter, 1), compute_type, inter_threads=inter
            )
            decoders[f"ctranslate2_{compute_type}_{inter}"] = functools.partial(in_input_order, ct2)
    return decoders, versions


def large_requests(versions, sources, sizes, work_dir, loader="saved_model"):
    """Each export's memory and time for one request of each size, in a fresh process.

    Args:
        versions: dict of export name to version folder.
        sources: list of str, repeated to fill a request.
        sizes: list of int, sentences a request.
        work_dir: str, where the requests' sentences are written.
        loader: str, one of `request_size.LOADERS`.

    Returns:
        `{name: {size: request_size.run_client's report}}`.
    """
    memory = {name: {} for name in versions}
    for size in sizes:
        path = os.path.join(work_dir, f"large_{size}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump([sources[i % len(sources)] for i in range(size)], handle)
        for name, version in versions.items():
            memory[name][size] = run_client(version, path, size, loader)
    return memory


def speed_results(cases, seconds, outputs, references, beams):
    """`(results, ratios)`: each case's time and BLEU; int8 against float32 and CTranslate2."""
    import sacrebleu

    results, rows = {}, []
    for name, beam in cases:
        middle = median(seconds[name, beam])
        bleu = sacrebleu.corpus_bleu(outputs[name, beam], [references]).score
        results[f"{name}_beam{beam}"] = {
            "median_seconds": round(middle, 3),
            "seconds": [round(s, 3) for s in seconds[name, beam]],
            "sentences_per_second": round(len(references) / middle, 1),
            "bleu": round(bleu, 2),
        }
        rows.append([name, beam, f"{len(references) / middle:.1f}", f"{bleu:.2f}"])
    ratios = {}
    for beam in beams:
        for flight in (1, 2):
            base = median(seconds[f"float32_{flight}", beam])
            for name in ("int8", "int8-weights"):
                mine = median(seconds[f"{name}_{flight}", beam])
                ratios[f"{name}_speedup_over_float32_beam{beam}_{flight}"] = round(base / mine, 3)
                theirs = median(seconds[f"ctranslate2_int8_{flight}", beam])
                ratios[f"{name}_time_over_ctranslate2_int8_beam{beam}_{flight}"] = round(
                    mine / theirs, 3
                )
    print(table(["decoder", "beam", "sentences/s", "BLEU"], rows))
    print(json.dumps(ratios, indent=1))
    return results, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="sentences a request")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--large", type=int, nargs="+", default=[512, 2048], help="sentences of the large requests"
    )
    parser.add_argument(
        "--signatures", nargs="*", help="export these besides translate and serving_default "
        "(default: every signature, as kt export writes them; memory grows with them)",
    )  # fmt: skip
    parser.add_argument(
        "--memory-only", action="store_true", help="export and measure the large requests only"
    )
    parser.add_argument(
        "--loader", choices=LOADERS, default="saved_model", help="how the large requests' "
        "process loads an export: tf.saved_model.load, or a TF1 Session as TF Serving does",
    )  # fmt: skip
    parser.add_argument(
        "--output", help="default: benchmarks/results/int8_serving.json, or "
        "int8_serving_memory.json with --memory-only",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.output is None:
        name = "int8_serving_memory.json" if args.memory_only else "int8_serving.json"
        args.output = os.path.join(RESULTS, name)
    sources, references = read_parallel(parser, args, "test_2016_flickr")

    model, max_length = load_run(args.run_dir)
    spm_path = os.path.join(args.run_dir, "sentencepiece.model")
    results, ratios = {}, {}
    with tempfile.TemporaryDirectory() as work_dir:
        if args.memory_only:
            versions = export_versions(
                model, spm_path, max_length, work_dir, args.batch_size, args.signatures
            )
        else:
            decoders, versions = build_decoders(
                model, spm_path, max_length, work_dir, args.batch_size, sources, args.signatures
            )
            cases = [(name, beam) for beam in args.beams for name in decoders]
            run = lambda case: decoders[case[0]](case[1])  # noqa: E731
            seconds, outputs = time_cases(run, cases, args.repeats)
            results, ratios = speed_results(cases, seconds, outputs, references, args.beams)
        memory = large_requests(versions, sources, args.large, work_dir, args.loader)
        sizes = {name: folder_bytes(version) for name, version in versions.items()}

    for name in EXPORTS:
        print(f"{name}: {sizes[name] / 2**20:.1f} MiB on disk")
        for size, report in memory[name].items():
            loaded, peak = report["loaded_kib"] / 1024, report["peak_kib"] / 1024
            print(f"  {size} sentences in one request: loaded {loaded:.0f} MiB, "
                  f"peak {peak:.0f} MiB ({report['seconds']:.1f} s)")  # fmt: skip
    write_result(
        {
            "benchmark": "int8_serving",
            "command": "python benchmarks/int8_serving.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "parameters": model.count_params(),
            "sentences": len(sources),
            "batch_size": args.batch_size,
            "repeats": 0 if args.memory_only else args.repeats,
            "loader": args.loader,
            "results": results,
            "ratios": ratios,
            "large_requests": memory,
            "export_bytes": sizes,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
