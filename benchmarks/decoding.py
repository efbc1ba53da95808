"""Decoding speed: cached vs uncached decoders, the SavedModel, and CTranslate2.

Usage:
    python benchmarks/decoding.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 3]

Translates Multi30k's test_2016_flickr (1,000 English sentences) with one
trained model, greedy and beam 4, through:
- `cached`: `greedy_search` / `beam_search` with the key/value cache, in a
  `tf.function`, as the SavedModel runs them;
- `uncached`: the same search recomputing the whole prefix at every step
  (`use_cache=False`, the TensorFlow tutorial's loop);
- `saved_model`: the exported SavedModel's `translate` signature, loaded back;
- `ctranslate2`: the same weights converted by `pipelines.serving.ctranslate2`
  (when CTranslate2 is installed), float32, 2 threads.
All take the same sentences, include tokenization, and search them sorted by
length in batches of `--batch-size` (128, the export's default chunk size):
ours receive requests of 1,024 sentences, which the graph sorts and chunks;
CTranslate2 receives all sentences with `max_batch_size` set to the same size.
Each repetition runs every decoder once, in turn; the figure is the median.
Prints a table and writes benchmarks/results/decoding.json with sentences/s,
target tokens/s, BLEU and the speed ratios.
"""

import argparse
import os
import sys
import tempfile

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

DECODERS = ("cached", "uncached", "saved_model", "ctranslate2")


def _keras_decoder(model, tok, max_length, use_cache, chunk_size):
    import tensorflow as tf

    from pipelines.serving.translation import translate_strings

    @tf.function(reduce_retracing=True)
    def run(inputs, beam_size, alpha, penalty_form):
        texts, scores = translate_strings(
            model,
            tok,
            inputs,
            beam_size,
            alpha,
            max_source_length=max_length,
            chunk_size=chunk_size,
            use_cache=use_cache,
            lengths={"penalty_form": penalty_form},
        )
        return {"translations": texts[:, 0], "scores": scores[:, 0]}

    def signature(inputs, beam_size, alpha, penalty_form=""):
        form = penalty_form.numpy().decode() if hasattr(penalty_form, "numpy") else penalty_form
        return run(inputs, int(beam_size), float(alpha), form or "gnmt")

    return signature


def build_decoders(run_dir, work_dir, names, batch_size):
    """`{name: translate(sentences, beam_size, alpha) -> list of str}`."""
    import tensorflow as tf

    from pipelines.data import tokenizer
    from pipelines.serving import saved_model as export
    from pipelines.serving.client import translate_lines

    model, max_length = load_run(run_dir)
    spm_path = os.path.join(run_dir, "sentencepiece.model")
    tok = tokenizer.load_tokenizer(spm_path)
    decoders = {}

    def lines_translator(signature):
        def translate(sentences, beam_size, alpha):
            lines = [s.encode("utf-8") for s in sentences]
            return translate_lines(signature, lines, beam_size, alpha)[0]

        return translate

    for use_cache, name in ((True, "cached"), (False, "uncached")):
        if name in names:
            decoders[name] = lines_translator(
                _keras_decoder(model, tok, max_length, use_cache, batch_size)
            )
    if "saved_model" in names:
        translator = export.Translator(
            model, spm_path, max_length, chunk_size=batch_size, signatures=["translate"]
        )
        path = export.export(translator, os.path.join(work_dir, "saved_models", "model"))
        decoders["saved_model"] = lines_translator(
            tf.saved_model.load(path).signatures["translate"]
        )
    if "ctranslate2" in names:
        try:
            from pipelines.serving.ctranslate2 import CTranslate2Translator, convert
        except ImportError:
            print("CTranslate2 not installed: skipping it", file=sys.stderr)
        else:
            path = convert(model, spm_path, os.path.join(work_dir, "ct2"), max_length)
            ct2 = CTranslate2Translator(path, threads=os.cpu_count() or 1)
            # CTranslate2's length penalty differs from GNMT's (see its module).
            decoders["ctranslate2"] = lambda s, beam, alpha: ct2.translate(
                s, beam, alpha, batch_size=batch_size
            )[0]
    return decoders


def summarize(args, argv, cases, seconds, outputs, sources, references, pieces):
    """Results and ratios from the repeats run so far; writes the JSON."""
    import sacrebleu

    rows, results = [], {}
    for name, beam in cases:
        elapsed = median(seconds[name, beam])
        hypotheses = outputs[name, beam]
        tokens = sum(len(p) + 1 for p in pieces.encode(hypotheses))  # + EOS
        key = f"{name}_beam{beam}"
        results[key] = {
            "decoder": name,
            "beam_size": beam,
            "seconds": seconds[name, beam],
            "median_seconds": round(elapsed, 3),
            "sentences_per_second": round(len(sources) / elapsed, 2),
            "target_tokens_per_second": round(tokens / elapsed, 1),
            "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        }
        rows.append([name, beam, results[key]["sentences_per_second"],
                     results[key]["target_tokens_per_second"], results[key]["bleu"]])  # fmt: skip

    def ratio(fast, slow):
        if fast in results and slow in results:
            return round(results[slow]["median_seconds"] / results[fast]["median_seconds"], 2)
        return None

    ratios = {}
    for beam in args.beams:
        ratios[f"cached_over_uncached_beam{beam}"] = ratio(
            f"cached_beam{beam}", f"uncached_beam{beam}"
        )
        # > 1: CTranslate2 is faster. The target is at most 1.5.
        ratios[f"ctranslate2_over_saved_model_beam{beam}"] = ratio(
            f"ctranslate2_beam{beam}", f"saved_model_beam{beam}"
        )
        ct2, ours = f"ctranslate2_beam{beam}", f"saved_model_beam{beam}"
        if ct2 in results and ours in results:
            pairs = zip(outputs["ctranslate2", beam], outputs["saved_model", beam], strict=True)
            same = sum(a == b for a, b in pairs)
            ratios[f"ctranslate2_identical_to_saved_model_beam{beam}"] = round(
                same / len(sources), 4
            )
    write_result(
        {
            "benchmark": "decoding",
            "command": "python benchmarks/decoding.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "source": os.path.abspath(args.source),
            "sentences": len(sources),
            "repeats": args.repeats,
            "repeats_completed": min(len(s) for s in seconds.values()),
            "alpha": args.alpha,
            "batch_size": args.batch_size,
            "results": results,
            "ratios": ratios,
        },
        args.output,
    )
    return rows, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--sentences", type=int, help="use only the first N sentences")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences searched at once")
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=DECODERS)
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding.json"))
    args = parser.parse_args(argv)

    import sentencepiece

    sources, references = read_parallel(parser, args, "test_2016_flickr")
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]
    pieces = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(args.run_dir, "sentencepiece.model")
    )

    with tempfile.TemporaryDirectory() as work_dir:
        decoders = build_decoders(args.run_dir, work_dir, args.decoders, args.batch_size)
        cases = [(name, beam) for beam in args.beams for name in decoders]

        def warm_up(case):  # tracing and loading
            # Two batch shapes: the second trace is the shape-generic one.
            decoders[case[0]](sources[:8], case[1], args.alpha)
            decoders[case[0]](sources[8:13], case[1], args.alpha)

        def after_repeat(seconds, outputs):
            for name, beam in cases:
                times = seconds[name, beam]
                print(f"repeat {len(times) - 1}: {name} beam {beam}: {times[-1]:.1f} s", flush=True)
            # Written after every repeat, so a stopped run keeps what it measured.
            summarize(args, argv, cases, seconds, outputs, sources, references, pieces)

        seconds, outputs = time_cases(
            lambda case: decoders[case[0]](sources, case[1], args.alpha),
            cases,
            args.repeats,
            warm_up,
            after_repeat,
        )

    rows, ratios = summarize(args, argv, cases, seconds, outputs, sources, references, pieces)
    print(table(["decoder", "beam", "sentences/s", "target tokens/s", "BLEU"], rows))
    for key, value in ratios.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
