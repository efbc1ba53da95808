"""Scores translations against references with sacreBLEU: BLEU and chrF.

    kt evaluate --hypotheses out.de --references test.de --output scores.json

Prints each score with its sacreBLEU signature and writes the same as JSON.
"""

import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.data.corpus import read_lines
from pipelines.errors import DataError
from pipelines.evaluation import score
from pipelines.files import check_input_file, prepare_output_file, write_json


def _evaluate(args):
    check_input_file(args.hypotheses, "--hypotheses")
    check_input_file(args.references, "--references")
    if args.output:
        prepare_output_file(args.output, "--output")
    hypotheses = read_lines(args.hypotheses)
    references = read_lines(args.references)
    if len(hypotheses) != len(references):
        raise DataError(
            f"{args.hypotheses} has {len(hypotheses)} lines but {args.references} has "
            f"{len(references)}"
        )
    if not references:
        raise DataError(f"{args.references} has no lines to score against")
    scores = score(hypotheses, references, args.lowercase)
    print(f"BLEU {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"chrF {scores['chrf']:.2f}  {scores['chrf_signature']}")
    if args.output:
        write_json(args.output, scores)


def main(argv=None, prog="kt evaluate"):
    parser = command_parser(prog, __doc__.splitlines()[0])
    parser.add_argument("--hypotheses", required=True, help="one translation a line")
    parser.add_argument("--references", required=True, help="one reference a line, aligned")
    parser.add_argument("--lowercase", action="store_true")
    parser.add_argument("--output", help="JSON file for the scores")
    return run(_evaluate, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
