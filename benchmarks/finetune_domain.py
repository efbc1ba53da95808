"""Fine-tuning on a shifted domain: before and after, with and without the original data mixed in.

Usage:
    python benchmarks/finetune_domain.py --output-dir runs/finetune-domain

The domain shift is the embedded corpus's: a model trained on English ->
German renderings (`--target-locale de`, the `default` recipe) is adapted to
Swiss German ones (`de_CH`: 1'234.5 where German writes 1.234,5; the rest
alike). Runs, in this process, one after another:

    kt train                                   (the source: the default recipe on 95% de,
                                                5% de_CH pairs; de alone with --german-only;
                                                none with --source)
    kt train --init-from SOURCE                (in-domain: de_CH pairs only)
    kt train --init-from SOURCE --set extend_vocabulary=N
                                               (in-domain, the vocabulary grown with the
                                                pieces of an N-piece de_CH vocabulary)
    kt train --init-from SOURCE --train-weights 7 3   (mixed: 70% de_CH, 30% de)

each fine-tuning run `--steps` steps of the `finetune` recipe at the source's
batch size (the de_CH pairs are other expressions than the source's; the de
pairs mixed in are the source's own training pairs), then scores the source
and both fine-tuned models with greedy search on the de_CH test pairs (the
new domain) and the de test pairs (what is forgotten). Writes
benchmarks/results/finetune_domain.json.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, set_flags, table, write_result  # noqa: E402


def write_pairs(folder, name, pairs):
    """Writes `(source, target)` pairs as `name.en` and `name.de`; returns the two paths."""
    paths = [os.path.join(folder, f"{name}.{side}") for side in ("en", "de")]
    for index, path in enumerate(paths):
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(f"{pair[index]}\n" for pair in pairs)
    return paths


def train(argv):
    from pipelines.commands import train as command

    status = command.main(argv)
    if status:
        raise SystemExit(f"kt train {' '.join(argv)} failed ({status})")


def greedy_bleu(run_dir, pairs, folder):
    """Greedy BLEU of a run's model on `pairs`, decoded as the end-of-run evaluation does."""
    import keras

    from pipelines.training.heldout import heldout_scores
    from pipelines.training.loading import load_config

    config = load_config("default", os.path.join(run_dir, "config.json"))
    model = keras.saving.load_model(os.path.join(run_dir, "model.keras"))
    os.makedirs(folder, exist_ok=True)
    for name in ("sentencepiece.model",):  # heldout_scores reads the vocabulary beside its files
        with open(os.path.join(run_dir, name), "rb") as source:
            with open(os.path.join(folder, name), "wb") as copy:
                copy.write(source.read())
    return heldout_scores(config, folder, model, pairs, "test")["greedy_bleu"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/finetune-domain")
    parser.add_argument("--source", help="a trained run on the de corpus (default: train one)")
    parser.add_argument("--steps", type=int, default=400, help="fine-tuning steps")
    parser.add_argument("--sizes", default="[20000,500,500]", help="train, validation, test")
    parser.add_argument("--set", action="append", default=[], help="source --set overrides")
    parser.add_argument(
        "--german-only", action="store_true", help="the source sees no de_CH pair (no apostrophe)"
    )
    parser.add_argument(
        "--extend-vocabulary", type=int, default=500, help="N of the grown arm (the source's size)"
    )
    parser.add_argument("--output", default=os.path.join(RESULTS, "finetune_domain.json"))
    args = parser.parse_args(argv)
    from pipelines.data.default_corpus import default_corpus
    from pipelines.data.tokenizer import vocabulary_size

    sizes = json.loads(args.sizes)
    os.makedirs(args.output_dir, exist_ok=True)
    # The source's own data (seed 0), and new expressions in the new domain (seed 1).
    corpora = {"de": default_corpus(sizes, "de", 0), "de_CH": default_corpus(sizes, "de_CH", 1)}
    data = os.path.join(args.output_dir, "data")
    os.makedirs(data, exist_ok=True)
    swiss = write_pairs(data, "train-de_CH", corpora["de_CH"]["train"])
    german = write_pairs(data, "train-de", corpora["de"]["train"])
    validation = write_pairs(data, "val-de_CH", corpora["de_CH"]["validation"])
    source = args.source or os.path.join(args.output_dir, "source")
    if not args.source:
        # A general model that saw a little of the new domain (other expressions,
        # seed 2), as a general corpus does: its vocabulary holds the domain's
        # characters (the apostrophe of 1'234.5), which a vocabulary trained on
        # German alone maps to <unk> (docs/start-from-a-model.md).
        rare = default_corpus([sizes[0] // 20, 0, 0], "de_CH", 2)["train"]
        german_validation = write_pairs(data, "val-de", corpora["de"]["validation"])
        mixed = [*write_pairs(data, "train-de_CH-rare", rare), "--train-weights", "19", "1"]
        train(["--output-dir", source, "--corpus", "files", "--train-files", *german,
               *([] if args.german_only else mixed),
               "--validation-files", *german_validation, "--heldout-split", "none",
               *set_flags(args.set)])  # fmt: skip
    recorded = json.loads(open(os.path.join(source, "config.json"), encoding="utf-8").read())
    common = ["--init-from", source, "--corpus", "files", "--validation-files", *validation,
              "--steps", str(args.steps), "--heldout-split", "none",
              "--batch-tokens", str(recorded["batching"]["batch_tokens"]),
              "--max-length", str(recorded["batching"]["max_length"])]  # fmt: skip
    arms = {
        "in_domain": ["--train-files", *swiss],
        "in_domain_extended": [
            "--train-files",
            *swiss,
            "--set",
            f"extend_vocabulary={args.extend_vocabulary}",
        ],
        "mixed_70_30": ["--train-files", *swiss, *german, "--train-weights", "7", "3"],
    }
    runs = {"source": source}
    for name, flags in arms.items():
        runs[name] = os.path.join(args.output_dir, name)
        train([*common, *flags, "--output-dir", runs[name]])
    scores = {
        name: {
            locale: greedy_bleu(run, corpora[locale]["test"], os.path.join(run, f"test-{locale}"))
            for locale in ("de_CH", "de")
        }
        for name, run in runs.items()
    }
    result = write_result(
        {
            "benchmark": "finetune_domain",
            "command": "python benchmarks/finetune_domain.py " + " ".join(argv or sys.argv[1:]),
            "steps": args.steps,
            "sizes": sizes,
            "source": "given" if args.source else "de" if args.german_only else "95% de, 5% de_CH",
            "extend_vocabulary": args.extend_vocabulary,
            "pieces": {
                name: vocabulary_size(os.path.join(run, "sentencepiece.model"))
                for name, run in runs.items()
            },
            "greedy_bleu": scores,
        },
        args.output,
    )
    rows = [[name, f"{s['de_CH']:.2f}", f"{s['de']:.2f}"] for name, s in scores.items()]
    print(table(["model", "de_CH test BLEU", "de test BLEU"], rows))
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
