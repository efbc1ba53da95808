"""Tokenization and batching of Multi30k's training set (29,000 pairs).

Usage:
    python benchmarks/tokenize_multi30k.py --multi30k-dir ../shared/data/multi30k

Prints and writes benchmarks/results/tokenize_multi30k.json: SentencePiece
training time, in-graph tokenization time (medians of repeated passes), a full
bucketed epoch, and the padding efficiency of token-budget batches.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from pipelines.data import batching, corpus, tokenizer  # noqa: E402


def timed(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="benchmarks/results/tokenize_multi30k.json")
    args = parser.parse_args()

    pairs = corpus.load_multi30k(args.multi30k_dir, "train")
    sentences = [s for pair in pairs for s in pair]
    path = os.path.join(tempfile.mkdtemp(), "m30k.model")
    train_seconds = timed(
        lambda: tokenizer.train_sentencepiece(sentences, path, args.vocabulary_size), 1
    )
    tok = tokenizer.load_tokenizer(path)
    import tensorflow as tf

    strings = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))
    # Tokenization alone, in chunks of 1,024 sentences as tokenize_pairs calls it.
    tokenized = strings.batch(1024).map(lambda s, t: (tok.tokenize(s), tok.tokenize(t)))
    tokenize_seconds = timed(lambda: sum(1 for _ in tokenized), args.repeats)
    dataset = batching.make_dataset(pairs, tok, args.batch_tokens, cache=False)
    epoch_seconds = timed(lambda: sum(1 for _ in dataset), args.repeats)
    stats = batching.padding_efficiency(dataset)
    result = {
        "pairs": len(pairs),
        "sentencepiece_train_seconds": round(train_seconds, 2),
        "tokenize_seconds_median": round(tokenize_seconds, 2),
        "bucketed_epoch_seconds_median": round(epoch_seconds, 2),
        "batch_tokens": args.batch_tokens,
        "padding_efficiency": round(stats["efficiency"], 4),
        "batches": stats["batches"],
        "date": time.strftime("%Y-%m-%d"),
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    for key, value in result.items():
        print(f"{key:32s} {value}")


if __name__ == "__main__":
    main()
