"""What the decoding controls cost: the SavedModel with them off, neutral and all on.

Usage:
    python benchmarks/decoding_controls.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 3]

Exports the run twice (greedy, and beam 4 with alpha 0.6) and translates
Multi30k's test_2016_flickr (1,000 English sentences) with each export's
- `off`: `serving_default`, no controls in the graph;
- `neutral`: `controlled` with every control at its neutral value;
- `all`: `controlled` with `no_repeat_ngram_size` 3, `repetition_penalty`
  1.2, `min_length` 2, `max_length` 100, `disable_unk` and the banned words
  of `--banned-words` (Mann, Frau, Hund: frequent German nouns in Multi30k).
in requests of `--batch-size` sentences, one after another. Each repetition
runs every arm once, in turn; the figure is the median. The target: `all`
costs at most 10% of `off`'s speed (ratio `off / all` time at most 1.10).
Writes benchmarks/results/decoding_controls.json.
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

ALL_ON = {
    "no_repeat_ngram_size": 3,
    "repetition_penalty": 1.2,
    "min_length": 2,
    "max_length": 100,
    "disable_unk": True,
}
ARMS = ("off", "neutral", "all")


def arms(version, banned_words):
    """`{arm: translate(lines) -> list of str}` for one export."""
    import tensorflow as tf

    from pipelines.serving.controls import CONTROLS, NEUTRAL

    loaded = tf.saved_model.load(version)

    def controlled(values):
        def translate(lines):
            rows = len(lines)
            tensors = {
                name: tf.constant([value] * rows, CONTROLS[name][0])
                for name, value in values.items()
            }
            outputs = loaded.signatures["controlled"](inputs=tf.constant(lines), **tensors)
            return [t.decode("utf-8") for t in outputs["translations"].numpy()]

        return translate

    def off(lines):
        outputs = loaded.signatures["serving_default"](inputs=tf.constant(lines))
        return [t.decode("utf-8") for t in outputs["translations"].numpy()]

    on = {**ALL_ON, "banned_words": "\n".join(banned_words)}
    return {"off": off, "neutral": controlled(dict(NEUTRAL)), "all": controlled(on)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--sentences", type=int, help="use only the first N sentences")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences a request")
    parser.add_argument(
        "--banned-words", nargs="+", default=["Mann", "Frau", "Hund"], help="banned in `all`"
    )
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding_controls.json"))
    args = parser.parse_args(argv)
    sources, references = read_parallel(parser, args, "test_2016_flickr")
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]

    import sacrebleu

    from pipelines.serving import saved_model

    model, max_length = load_run(args.run_dir)
    spm_path = os.path.join(args.run_dir, "sentencepiece.model")
    lines = [s.encode("utf-8") for s in sources]
    batches = [lines[i : i + args.batch_size] for i in range(0, len(lines), args.batch_size)]
    with tempfile.TemporaryDirectory(prefix="decoding_controls_") as work:
        searches = {}
        for beam_size in (1, 4):
            translator = saved_model.Translator(
                model, spm_path, max_length, beam_size=beam_size,
                signatures=["serving_default", "controlled"],
            )  # fmt: skip
            version = saved_model.export(translator, os.path.join(work, f"beam{beam_size}"))
            searches[beam_size] = arms(version, args.banned_words)

        def run(case):
            translate = searches[case[0]][case[1]]
            return [t for batch in batches for t in translate(batch)]

        cases = [(beam, arm) for beam in searches for arm in ARMS]
        seconds, outputs = time_cases(run, cases, args.repeats)
    results, rows = {}, []
    for (beam, arm), times in seconds.items():
        bleu = sacrebleu.corpus_bleu(outputs[beam, arm], [references]).score
        banned = sum(
            any(w in line.split() for w in args.banned_words) for line in outputs[beam, arm]
        )
        results[f"beam{beam}_{arm}"] = {
            "seconds": times,
            "sentences_per_second": round(len(sources) / median(times), 2),
            "bleu": round(bleu, 2),
            "lines_with_a_banned_word": banned,
        }
        rows.append([beam, arm, results[f"beam{beam}_{arm}"]["sentences_per_second"],
                     round(bleu, 2), banned])  # fmt: skip
    ratios = {
        f"beam{beam}_{arm}_time_over_off": round(
            median(seconds[beam, arm]) / median(seconds[beam, "off"]), 3
        )
        for beam in searches
        for arm in ("neutral", "all")
    }
    print(table(["beam", "controls", "sentences/s", "BLEU", "lines with a banned word"], rows))
    print(ratios)
    write_result(
        {
            "benchmark": "decoding_controls",
            "command": "python benchmarks/decoding_controls.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "sentences": len(sources),
            "batch_size": args.batch_size,
            "controls_all": {**ALL_ON, "banned_words": args.banned_words},
            "results": results,
            "ratios": ratios,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
