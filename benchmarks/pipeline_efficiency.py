"""Input pipeline: bucketed token-budget batches vs fixed-length padding.

Usage:
    python benchmarks/pipeline_efficiency.py --multi30k-dir ../shared/data/multi30k [--repeats 3]

One epoch of Multi30k's training pairs, tokenized in the graph with the same
SentencePiece model, batched three ways:
- `bucketed`: `pipelines.data.batching.make_dataset` (length buckets, about
  `--batch-tokens` tokens per side of a batch);
- `fixed_longest`: every sentence padded to the longest one, `--batch-size`
  sentences a batch (lossless fixed-length padding);
- `fixed_keras_io`: padded or cut to `--fixed-length` tokens, as in the
  keras.io English-to-Spanish Transformer example (sequence_length 20); the
  tokens it cuts are reported as `truncated_tokens`.
Padding efficiency is real tokens over all tokens (both sides, pads
included). Pipeline throughput is examples and real tokens per second for
a full pass from strings to batches (tokenization included, no caching),
median over repetitions run in turn.

Writes benchmarks/results/pipeline_efficiency.json and prints a table.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, write_result  # noqa: E402


def fixed_length_dataset(pairs, tok, length, batch_size):
    """Sentences padded (and cut) to `length` tokens, `batch_size` a batch."""
    import tensorflow as tf

    from pipelines.data.batching import tokenize_pairs

    def pad(example):
        target = example["target"]  # BOS + pieces + EOS
        sides = example["source"], target[:-1], target[1:]
        return tuple(tf.pad(x[:length], [[0, length - tf.shape(x[:length])[0]]]) for x in sides)

    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    dataset = tf.data.Dataset.from_tensor_slices((sources, targets)).apply(tokenize_pairs(tok))
    dataset = dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size)
    return dataset.map(lambda s, t_in, t_out: ((s, t_in), t_out)).prefetch(tf.data.AUTOTUNE)


def measure(dataset):
    """One pass: real and padded tokens (both sides), examples, seconds."""
    import numpy as np

    real = padded = examples = 0
    started = time.perf_counter()
    # Labels, not decoder inputs: a padded batch's decoder inputs keep the EOS
    # of every target but the longest, in positions whose labels are padding.
    for (source, _), labels in dataset:
        source, labels = source.numpy(), labels.numpy()
        real += int(np.sum(source != 0) + np.sum(labels != 0))
        padded += source.size + labels.size
        examples += source.shape[0]
    return real, padded, examples, time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--sentences", type=int, help="use only the first N training pairs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64, help="fixed-length batches")
    parser.add_argument("--fixed-length", type=int, default=20)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--output", default=os.path.join(RESULTS, "pipeline_efficiency.json"))
    args = parser.parse_args(argv)

    import numpy as np
    import sentencepiece

    from pipelines.data import batching, tokenizer
    from pipelines.data.corpus import load_multi30k

    pairs = load_multi30k(args.multi30k_dir, "train")[: args.sentences]
    with tempfile.TemporaryDirectory() as work_dir:
        spm_path = os.path.join(work_dir, "sentencepiece.model")
        texts = [text for pair in pairs for text in pair]
        tokenizer.train_sentencepiece(texts, spm_path, args.vocabulary_size)
        tok = tokenizer.load_tokenizer(spm_path)
        processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
        lengths = [len(pieces) for pieces in processor.encode(texts)]
    # Source: pieces + EOS; target input: BOS + pieces.
    longest = max(lengths) + 1
    all_tokens = sum(lengths) + len(lengths)
    kept = sum(min(n + 1, args.fixed_length) for n in lengths)
    datasets = {
        "bucketed": lambda: batching.make_dataset(
            pairs, tok, args.batch_tokens, max_length=longest, shuffle=False, cache=False
        ),
        "fixed_longest": lambda: fixed_length_dataset(pairs, tok, longest, args.batch_size),
        "fixed_keras_io": lambda: fixed_length_dataset(
            pairs, tok, args.fixed_length, args.batch_size
        ),
    }
    measured = {name: [] for name in datasets}
    for repeat in range(args.repeats):
        for name, make in datasets.items():
            measured[name].append(measure(make()))
            real, padded, _, seconds = measured[name][-1]
            print(f"repeat {repeat}: {name}: {real / padded:.1%} real, "
                  f"{real / seconds:,.0f} real tokens/s", flush=True)  # fmt: skip
    results, rows = {}, []
    for name, runs in measured.items():
        real, padded, examples, _ = runs[0]
        seconds = median([run[3] for run in runs])
        results[name] = {
            "padding_efficiency": round(real / padded, 4),
            "real_tokens": real,
            "padded_tokens": padded,
            "examples": examples,
            "truncated_tokens": all_tokens - real if name == "fixed_keras_io" else 0,
            "seconds": [round(run[3], 3) for run in runs],
            "examples_per_second": round(examples / seconds, 1),
            "real_tokens_per_second": round(real / seconds, 1),
        }
        rows.append([name, f"{real / padded:.1%}", f"{examples / seconds:,.0f}",
                     f"{real / seconds:,.0f}", results[name]["truncated_tokens"]])  # fmt: skip
    write_result(
        {
            "benchmark": "pipeline_efficiency",
            "command": "python benchmarks/pipeline_efficiency.py " + " ".join(argv or sys.argv[1:]),
            "pairs": len(pairs),
            "longest_sequence": longest,
            "tokens_within_fixed_length": round(kept / all_tokens, 4),
            "mean_sequence": round(float(np.mean(lengths)) + 1, 2),
            "batch_tokens": args.batch_tokens,
            "batch_size": args.batch_size,
            "fixed_length": args.fixed_length,
            "repeats": args.repeats,
            "results": results,
        },
        args.output,
    )
    header = ["batching", "padding efficiency", "examples/s", "real tokens/s", "tokens cut"]
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
