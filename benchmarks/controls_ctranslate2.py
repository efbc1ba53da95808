"""Decoding controls against CTranslate2: the same translations, sentence for sentence?

Usage:
    python benchmarks/controls_ctranslate2.py --run-dir runs/multi30k \
        --multi30k-dir ../shared/data/multi30k

Converts the run's model with `kt ct2-export`'s `convert` and translates
Multi30k's test_2016_flickr (1,000 English sentences) with beam 4, alpha 0.6
in CTranslate2's `length ** alpha` form (0 in `prefix`), in each arm:
- `controls`: `no_repeat_ngram_size` 3, `repetition_penalty` 1.2,
  `min_length` 8, `disable_unk`;
- `banned`: the words of `--banned-words` and the phrase `ein Mann`
  (CTranslate2's `suppress_sequences`);
- `prefix`: every third sentence starts with the first word of its plain
  translation, with the controls of `controls`; `prefix_alpha` the same
  with alpha 0.6;
- `greedy`: `controls`' controls with beam 1.
Ours is `translation.translate_strings` (the SavedModel's path) with each
sentence's controls as the `controlled_search` signature takes them, under
beam search's two stopping rules: `early_stop` (CTranslate2's rule without a
length penalty) and the default (the export's; with a length penalty
CTranslate2 stops once `beam_size` hypotheses have finished, which the
default rule is closer to). The target: CTranslate2's translation on at
least 98% of the sentences, with the rule that matches its own.
Writes benchmarks/results/controls_ctranslate2.json.
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
    read_parallel,
    table,
    write_result,
)

CONTROLS = {
    "no_repeat_ngram_size": 3,
    "repetition_penalty": 1.2,
    "min_length": 8,
    "disable_unk": True,
}
ALPHA = 0.6


def arms(banned_words):
    """`{arm: (beam_size, alpha, controls, with_prefixes)}`; banned words as text, one a line.

    The prefix arms run without a length penalty too: CTranslate2 scores a prefix's tokens 0
    where ours adds their log-probabilities, an offset the length penalty divides differently
    for hypotheses of different lengths.
    """
    return {
        "controls": (4, ALPHA, CONTROLS, False),
        "banned": (4, ALPHA, {"banned_words": "\n".join(banned_words)}, False),
        "prefix": (4, 0.0, CONTROLS, True),
        "prefix_alpha": (4, ALPHA, CONTROLS, True),
        "greedy": (1, ALPHA, CONTROLS, False),
    }


def ours(model, tokenizer, max_length, sentences, search, controls, prefixes, early_stop):
    """Our translations of `sentences` (list of bytes) through `translate_strings`.

    `search` is `(beam_size, alpha)`.
    """
    import tensorflow as tf

    from pipelines.data.tokenizer import sides
    from pipelines.serving.controls import NEUTRAL, control_tensors
    from pipelines.serving.translation import translate_strings

    rows = len(sentences)
    values = {name: [controls.get(name, neutral)] * rows for name, neutral in NEUTRAL.items()}

    @tf.function
    def run(inputs, prefixes):
        tensors = control_tensors(sides(tokenizer)[1], inputs, values)
        return translate_strings(
            model, tokenizer, inputs, *search, max_source_length=max_length,
            early_stop=early_stop, prefixes=prefixes, controls=tensors,
            lengths={"penalty_form": "power"},
        )[0][:, 0]  # fmt: skip

    texts = run(tf.constant(sentences), tf.constant(prefixes or [b""] * rows))
    return [text.decode("utf-8") for text in texts.numpy()]


def theirs(translator, processor, sources, search, controls, prefixes):
    """CTranslate2's translations with the same controls (banned words as id sequences)."""
    settings = {name: value for name, value in controls.items() if name != "banned_words"}
    if controls.get("banned_words"):
        words = controls["banned_words"].split("\n")
        settings["banned_tokens"] = [processor.encode(word) for word in words]
    texts = [prefix.decode("utf-8") for prefix in prefixes] if prefixes else None
    beam_size, alpha = search
    return translator.translate(
        sources, beam_size=beam_size, length_penalty=alpha, controls=settings, prefixes=texts
    )[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--sentences", type=int, help="use only the first N sentences")
    parser.add_argument("--banned-words", nargs="+", default=["Mann", "Frau", "Hund", "ein Mann"])
    parser.add_argument("--output", default=os.path.join(RESULTS, "controls_ctranslate2.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "test_2016_flickr")
    sources = sources[: args.sentences] if args.sentences else sources

    import sentencepiece as spm

    from pipelines.data.tokenizer import load_tokenizer
    from pipelines.serving.ctranslate2 import CTranslate2Translator, convert

    model, max_length = load_run(args.run_dir)
    spm_path = os.path.join(args.run_dir, "sentencepiece.model")
    tokenizer = load_tokenizer(spm_path)
    processor = spm.SentencePieceProcessor(model_file=spm_path)
    lines = [s.encode("utf-8") for s in sources]
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="controls_ct2_") as work:
        path = convert(model, spm_path, os.path.join(work, "ct2"), max_source_length=max_length)
        translator = CTranslate2Translator(path)
        plain = {
            alpha: ours(model, tokenizer, max_length, lines, (4, alpha), {}, None, alpha == 0)
            for alpha in (0.0, ALPHA)
        }  # without controls, under the rule each alpha is compared with
        # A first word of at most 20 characters (an untrained model's may outgrow the limit).
        firsts = [(text.split() or [""])[0] for text in plain[ALPHA]]
        firsts = [(word if len(word) <= 20 else "").encode("utf-8") for word in firsts]
        for arm, (beam_size, alpha, controls, with_prefixes) in arms(args.banned_words).items():
            prefixes = None
            if with_prefixes:
                prefixes = [b"" if i % 3 else first for i, first in enumerate(firsts)]
            search = (beam_size, alpha)
            reference = theirs(translator, processor, sources, search, controls, prefixes)
            agreement = {}
            for rule, early_stop in (("early_stop", True), ("default", False)):
                texts = ours(
                    model, tokenizer, max_length, lines, search, controls, prefixes, early_stop
                )
                same = [a == b for a, b in zip(texts, reference, strict=True)]
                agreement[rule] = round(100 * sum(same) / len(same), 2)
                if early_stop == (alpha == 0):  # the rule CTranslate2's matches
                    changed = sum(a != b for a, b in zip(texts, plain[alpha], strict=True))
                    differing = [i for i, s in enumerate(same) if not s][:10]
            results[arm] = {
                "beam_size": beam_size,
                "alpha": alpha,
                "controls": controls,
                "prefixed_sentences": sum(bool(p) for p in prefixes or []),
                "percent_equal": agreement,
                "changed_by_the_controls": changed,
                "first_differing_sentences": differing,
            }
            rows.append([arm, beam_size, alpha, agreement["early_stop"], agreement["default"],
                         changed])  # fmt: skip
    header = ["arm", "beam", "alpha", "% equal (early_stop)", "% equal (default)", "changed"]
    print(table(header, rows))
    write_result(
        {
            "benchmark": "controls_ctranslate2",
            "command": "python benchmarks/controls_ctranslate2.py "
            + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "sentences": len(sources),
            "penalty_form": "power",
            "results": results,
        },
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
