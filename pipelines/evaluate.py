"""Scores translations against references with sacreBLEU: BLEU and chrF.

    python -m pipelines.evaluate --hypotheses out.de --references test.de --output scores.json

Prints each score with its sacreBLEU signature and writes the same as JSON.
"""

import argparse
import json
import sys

import sacrebleu

from pipelines.corpus import DataError, read_lines


def score(hypotheses, references, lowercase=False):
    """Corpus BLEU and chrF of aligned lists of str.

    Returns:
        dict with `bleu`, `chrf` (floats), their `*_signature` strings and
        `sentences`.
    """
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
    chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
    return {
        "bleu": round(bleu.corpus_score(hypotheses, [references]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf.corpus_score(hypotheses, [references]).score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.evaluate",
        description="BLEU and chrF with sacreBLEU (`kt-evaluate`).",
    )
    parser.add_argument("--hypotheses", required=True, help="one translation a line")
    parser.add_argument("--references", required=True, help="one reference a line, aligned")
    parser.add_argument("--lowercase", action="store_true")
    parser.add_argument("--output", help="JSON file for the scores")
    args = parser.parse_args(argv)
    try:
        hypotheses = read_lines(args.hypotheses)
        references = read_lines(args.references)
        if len(hypotheses) != len(references):
            raise DataError(
                f"{args.hypotheses} has {len(hypotheses)} lines but {args.references} has "
                f"{len(references)}"
            )
        scores = score(hypotheses, references, args.lowercase)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"BLEU {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"chrF {scores['chrf']:.2f}  {scores['chrf_signature']}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(scores, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
