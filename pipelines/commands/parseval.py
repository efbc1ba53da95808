"""Scores parse trees against gold trees: labelled precision, recall, F1 (EVALB's conventions).

    kt parseval --trees dev.trees --gold dev.gold.trees --output scores.json
    kt parseval --trees dev.trees --treebank data/treebank --split dev
    kt parseval --right-branching --treebank data/treebank --split dev

Trees are one bracketed tree a line, Penn Treebank style, over the same
words as the gold trees (`kt parse` writes them). Gold trees come from a
file, or from the treebank's `.mrg` files (cleaned as training reads them:
see docs/parsing.md for the split). `--right-branching` scores the
right-branching baseline on the gold trees' words instead of a file.
Scores follow EVALB's COLLINS.prm conventions (`pipelines/parsing/evalb.py`),
over all sentences and over those of 40 words or fewer.
"""

import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.data.corpus import read_lines
from pipelines.errors import ConfigError, DataError
from pipelines.files import check_input_file, prepare_output_file, write_json


def _read_trees(path, flag):
    from pipelines.parsing.evalb import read_bracketed

    trees = []
    for number, line in enumerate(read_lines(path), start=1):
        try:
            trees.append(read_bracketed(line))
        except ValueError as error:
            reason = str(error).splitlines()[0]
            raise DataError(
                f"{flag} {path}, line {number}: not a bracketed tree ({reason})"
            ) from None
    return trees


def _parseval(args):
    from pipelines.parsing import trees as treebank
    from pipelines.parsing.evalb import score_trees

    if bool(args.gold) == bool(args.treebank):
        raise ConfigError("give the gold trees as --gold FILE or --treebank DIR (one of them)")
    if bool(args.trees) == args.right_branching:
        raise ConfigError("give the trees to score as --trees FILE or --right-branching (one)")
    if args.split not in treebank.SPLITS:
        raise ConfigError(
            f"--split must be one of {sorted(treebank.SPLITS)}. Received: {args.split}"
        )
    for flag, path in (("--trees", args.trees), ("--gold", args.gold)):
        if path:
            check_input_file(path, flag)
    if args.output:
        prepare_output_file(args.output, "--output")
    if args.gold:
        gold, gold_name = _read_trees(args.gold, "--gold"), f"--gold {args.gold}"
    else:
        gold = treebank.read_trees(args.treebank, args.split)
        gold_name = f"--treebank {args.treebank} ({args.split})"
        if not gold:
            raise DataError(
                f"--treebank {args.treebank}: no wsj_NNNN.mrg files of the {args.split} split"
            )
    if args.right_branching:
        test = [treebank.right_branching(tree.leaves()) for tree in gold]
    else:
        test = _read_trees(args.trees, "--trees")
        if len(test) != len(gold):
            raise DataError(
                f"--trees {args.trees} has {len(test)} trees but {gold_name} has {len(gold)}"
            )
    try:
        scores = score_trees(gold, test)
    except ValueError as error:
        raise DataError(f"--trees {args.trees}: {error}") from None
    for subset, name in (("all", "all sentences"), ("len<=40", "<= 40 words")):
        s = scores[subset]
        print(
            f"{name}: {s['sentences']} sentences, labelled precision {s['precision']:.2f}, "
            f"recall {s['recall']:.2f}, F1 {s['f1']:.2f}, exact match {s['exact_match']:.2f}"
        )
    if args.output:
        write_json(args.output, scores)


def main(argv=None, prog="kt parseval"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("--trees", help="trees to score, one a line")
    parser.add_argument("--right-branching", action="store_true", help="score the baseline")
    parser.add_argument("--gold", help="gold trees, one a line, aligned")
    parser.add_argument("--treebank", help="or a folder of wsj_NNNN.mrg files")
    parser.add_argument("--split", default="dev", help="with --treebank: train, dev or test")
    parser.add_argument("--output", help="JSON file for the scores")
    return run(_parseval, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
