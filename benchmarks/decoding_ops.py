"""Candidate forms of a decoding step's pieces, timed side by side.

Usage:
    python benchmarks/decoding_ops.py [--rows 32 128 512] [--keys 8 20]

Each piece of a greedy or beam step that a change could make cheaper is
written in the form the search uses now and in the candidate forms, each run
`--steps` times in a `tf.while_loop` inside a `tf.function`, as the SavedModel
runs a step; forms alternate, `--repeats` times, and the median time a step
is reported. Every candidate is checked to compute what the current form
computes. The pieces:

- `vocabulary`: the `(R, D)` decoder output projected onto the vocabulary,
  then greedy's choice: log-softmax, ban padding and start, top-1 (now);
  the ban and top-1 on the logits with the chosen token's log-probability
  as its logit minus the log-sum-exp (no `(R, V)` log-probabilities); the
  ban after a top-3 (no `(R, V)` select).
- `ban`: log-probabilities with padding and start made impossible by a
  select (now), by adding a `(V,)` bias, by a scatter of the two columns;
  then the top-1.
- `attention_logits`, `attention_sum`: one query a row over `keys` keys,
  `(R, H, 1, K)` against `(R, H, keys, K)`, as products and sums (now) or as
  a batched matrix product.

These are the ops alone; a change is kept only if the whole decoder
(`benchmarks/decoding.py`) is faster with it. Prints a table and writes
benchmarks/results/decoding_ops.json.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, write_result  # noqa: E402

PAD, BOS = 0, 1  # the ids banned, as `ban_special_tokens` bans the model's


def forms(tf, rows, keys, vocabulary, width=128, heads=4, head_dim=32):
    """`{piece: (inputs, {form: function})}`, the first form the current one."""
    rng = tf.random.Generator.from_seed(0)
    kernel = rng.normal((width, vocabulary)) * 0.1  # (D, V)
    banned = tf.constant([i in (PAD, BOS) for i in range(vocabulary)])  # (V,)

    def pick(scores):  # (R, V) -> (R,): the top score plus its id, so both are compared
        values, ids = tf.math.top_k(scores, 1)
        return values[:, 0] + tf.cast(ids[:, 0], tf.float32)

    def current(states):
        return pick(tf.where(banned, -1e9, tf.nn.log_softmax(states @ kernel)))

    def logits_only(states):
        logits = states @ kernel  # (R, V)
        values, ids = tf.math.top_k(tf.where(banned, -1e9, logits), 1)
        chosen = values[:, 0] - tf.reduce_logsumexp(logits, axis=-1)
        return chosen + tf.cast(ids[:, 0], tf.float32)

    def top3(states):
        values, ids = tf.math.top_k(tf.nn.log_softmax(states @ kernel), 3)  # (R, 3)
        first = tf.argmax(tf.cast((ids != PAD) & (ids != BOS), tf.int32), axis=1)  # (R,)
        chosen = tf.gather(values, first, batch_dims=1)
        return chosen + tf.cast(tf.gather(ids, first, batch_dims=1), tf.float32)

    def ban_add(log_probs):
        return pick(log_probs + tf.where(banned, -1e9, 0.0))

    def ban_scatter(log_probs):
        cells = tf.stack(tf.meshgrid(tf.range(rows), [PAD, BOS], indexing="ij"), -1)  # (R, 2, 2)
        return pick(tf.tensor_scatter_nd_update(log_probs, cells, tf.fill([rows, 2], -1e9)))

    values = rng.normal((rows, heads, keys, head_dim))  # (R, H, S, K)

    def logits_sum(query):  # (R, H, 1, K) -> (R,)
        return tf.reduce_sum(query * values, axis=[1, 2, 3])

    def logits_matmul(query):
        return tf.reduce_sum(tf.matmul(query, values, transpose_b=True), axis=[1, 2, 3])

    def weighted_sum(weights):  # (R, H, 1, S) -> (R,)
        outputs = tf.reduce_sum(tf.transpose(weights, (0, 1, 3, 2)) * values, axis=2)
        return tf.reduce_sum(outputs, axis=[1, 2])

    def weighted_matmul(weights):
        return tf.reduce_sum(tf.matmul(weights, values), axis=[1, 2, 3])

    log_probs = tf.nn.log_softmax(rng.normal((rows, vocabulary)))
    return {
        "vocabulary": (
            rng.normal((rows, width)),
            {"log_softmax_ban_top1": current, "logits_top1_logsumexp": logits_only,
             "log_softmax_top3_ban": top3},
        ),
        "ban": (
            log_probs,
            {"select": lambda x: pick(tf.where(banned, -1e9, x)), "add_bias": ban_add,
             "scatter": ban_scatter},
        ),
        "attention_logits": (
            rng.normal((rows, heads, 1, head_dim)),
            {"products_and_sums": logits_sum, "batched_matmul": logits_matmul},
        ),
        "attention_sum": (
            tf.nn.softmax(rng.normal((rows, heads, 1, keys))),
            {"products_and_sums": weighted_sum, "batched_matmul": weighted_matmul},
        ),
    }  # fmt: skip


def looped(tf, function, steps):
    """A `tf.function` running `function` `steps` times in a `tf.while_loop`."""

    @tf.function
    def run(inputs):
        def body(index, inputs, total):  # inputs change a little, so no step is hoisted
            return index + 1, inputs + 1e-6, total + function(inputs)

        total = tf.zeros(tf.shape(inputs)[:1])
        return tf.while_loop(lambda index, *_: index < steps, body, (0, inputs, total))[2]

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--keys", type=int, nargs="+", default=[8, 20])
    parser.add_argument("--vocabulary", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=400, help="steps a timed call")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding_ops.json"))
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    results, rows_out = {}, []
    for rows in args.rows:
        for keys in args.keys:
            shape = f"rows={rows},keys={keys}"
            for piece, (inputs, candidates) in forms(tf, rows, keys, args.vocabulary).items():
                if piece in ("vocabulary", "ban") and keys != args.keys[0]:
                    continue  # these do not depend on the keys
                runs = {name: looped(tf, fn, args.steps) for name, fn in candidates.items()}
                for run in runs.values():
                    run(inputs)  # tracing, not timed
                # One step of each, to compare: ids exactly, values to float32 rounding.
                outputs = {name: fn(inputs).numpy() for name, fn in candidates.items()}
                times = {name: [] for name in runs}
                for _ in range(args.repeats):
                    for name, run in runs.items():
                        start = time.perf_counter()
                        run(inputs).numpy()
                        times[name].append((time.perf_counter() - start) / args.steps * 1e6)
                reference = outputs[next(iter(runs))]
                for name in runs:
                    same = bool(np.allclose(outputs[name], reference, rtol=1e-5, atol=1e-3))
                    entry = {"microseconds": round(median(times[name]), 1), "same_result": same}
                    results.setdefault(piece, {}).setdefault(name, {})[shape] = entry
                    rows_out.append([piece, name, rows, keys, entry["microseconds"], same])
    write_result(
        {
            "benchmark": "decoding_ops",
            "command": "python benchmarks/decoding_ops.py " + " ".join(argv or sys.argv[1:]),
            "steps": args.steps,
            "repeats": args.repeats,
            "vocabulary": args.vocabulary,
            "results": results,
        },
        args.output,
    )
    print(table(["piece", "form", "rows", "keys", "µs a step", "same result"], rows_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
