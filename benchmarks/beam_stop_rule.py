"""Beam search's two stopping rules on a validation set: BLEU and speed.

Usage:
    python benchmarks/beam_stop_rule.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k [--repeats 3]

Translates Multi30k's validation set (never a test set: this chooses a default)
with beam 4 and alpha 0.6 under the default rule (a sentence is done once 4
hypotheses have finished and no live one scores better) and under
`early_stop=True` (done once its best extension ends, CTranslate2's rule), both
in-process through `pipelines.serving.translation.translate_strings`, alternating,
and reports median sentences/s, cased sacreBLEU and how many translations
differ. Writes benchmarks/results/beam_stop_rule.json.
"""

import argparse
import os
import sys

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

RULES = {"default": False, "early_stop": True}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "val")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(RESULTS, "beam_stop_rule.json"))
    args = parser.parse_args(argv)

    import sacrebleu
    import tensorflow as tf

    from pipelines.data.tokenizer import load_tokenizer
    from pipelines.serving.translation import translate_strings

    sources, references = read_parallel(parser, args, "val")
    model, max_length = load_run(args.run_dir)
    tokenizer = load_tokenizer(os.path.join(args.run_dir, "sentencepiece.model"))

    def translator(early_stop):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def run(batch):
            texts, _ = translate_strings(
                model, tokenizer, batch, 4, 0.6, max_source_length=max_length,
                early_stop=early_stop,
            )  # fmt: skip
            return texts[:, 0]

        return run

    translators = {name: translator(early_stop) for name, early_stop in RULES.items()}
    inputs = tf.constant(sources)
    seconds, outputs = time_cases(
        lambda name: [text.decode("utf-8") for text in translators[name](inputs).numpy()],
        list(RULES),
        args.repeats,
        warm_up=lambda name: translators[name](inputs[:8]),  # tracing
    )
    results, rows = {}, []
    for name in RULES:
        bleu = sacrebleu.corpus_bleu(outputs[name], [references]).score
        results[name] = {
            "seconds": [round(s, 3) for s in seconds[name]],
            "sentences_per_second": round(len(sources) / median(seconds[name]), 1),
            "bleu": round(bleu, 2),
        }
        rows.append([name, results[name]["sentences_per_second"], results[name]["bleu"]])
    differ = sum(a != b for a, b in zip(outputs["default"], outputs["early_stop"], strict=True))
    write_result(
        {
            "benchmark": "beam_stop_rule",
            "command": "python benchmarks/beam_stop_rule.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "source": os.path.abspath(args.source),
            "sentences": len(sources),
            "beam_size": 4,
            "alpha": 0.6,
            "results": results,
            "translations_that_differ": differ,
        },
        args.output,
    )
    print(table(["rule", "sentences/s", "BLEU"], rows))
    print(f"translations that differ: {differ} of {len(sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
