"""Candidate forms of a decoding step's pieces, timed side by side.

Usage:
    python benchmarks/decoding_ops.py [--rows 32 128 512] [--keys 8 20]

Each piece of a greedy or beam step that a change could make cheaper is
written in the form the search uses now and in the candidate forms, each run
`--steps` times in a `tf.while_loop` inside a `tf.function`, as the SavedModel
runs a step; each of `--repeats` rounds times every form, starting with
another one, and the median time a step is reported. Every candidate is
checked to compute what the current form computes. `(loop alone)` times the
loop's control; the update of the inputs each step, which every form pays,
is not in it. The pieces:

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
from keras_transformer.decoding.steps import IMPOSSIBLE  # noqa: E402

PAD, BOS = 0, 1  # the ids banned, as `ban_special_tokens` bans the model's


def _normal(tf, shape, seed):
    return tf.random.stateless_normal(shape, seed=[0, seed])


def output_kernel(tf, width, vocabulary):
    """The `(width, vocabulary)` projection onto the vocabulary the `vocabulary` piece uses."""
    return _normal(tf, (width, vocabulary), 1) * 0.1


def attention_values(tf, rows, keys, heads=4, head_dim=32):
    """The `(R, H, S, K)` keys (and values) the attention pieces attend."""
    return _normal(tf, (rows, heads, keys, head_dim), 2)


def vocabulary_forms(tf, rows, vocabulary, width=128):
    """The `vocabulary` and `ban` pieces, each with its inputs and forms, the current form first.

    Args:
        tf: the `tensorflow` module.
        rows: int `R`, rows of a step (sentences, or sentences times beams).
        vocabulary: int `V`.
        width: int, the model's `D`.

    Returns:
        `{piece: (inputs, {form: function})}`; every form maps its inputs to
        float32 `(R, 2)`, each row's chosen log-probability and id.
    """
    kernel = output_kernel(tf, width, vocabulary)  # (D, V)
    banned = tf.constant([i in (PAD, BOS) for i in range(vocabulary)])  # (V,)

    def pick(scores):  # (R, V) -> (R, 2): the top score and its id
        values, ids = tf.math.top_k(scores, 1)
        return tf.concat([values, tf.cast(ids, tf.float32)], axis=1)

    def current(states):  # (R, D), as `greedy_search` chooses
        return pick(tf.where(banned, IMPOSSIBLE, tf.nn.log_softmax(states @ kernel)))

    def logits_only(states):
        logits = states @ kernel  # (R, V)
        values, ids = tf.math.top_k(tf.where(banned, IMPOSSIBLE, logits), 1)  # (R, 1) each
        chosen = values - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
        return tf.concat([chosen, tf.cast(ids, tf.float32)], axis=1)

    def top3(states):
        values, ids = tf.math.top_k(tf.nn.log_softmax(states @ kernel), 3)  # (R, 3)
        first = tf.argmax(tf.cast((ids != PAD) & (ids != BOS), tf.int32), axis=1)  # (R,)
        chosen = tf.gather(values, first, batch_dims=1)
        chosen_ids = tf.cast(tf.gather(ids, first, batch_dims=1), tf.float32)
        return tf.stack([chosen, chosen_ids], axis=1)

    def ban_scatter(log_probs):  # (R, V)
        cells = tf.stack(tf.meshgrid(tf.range(rows), [PAD, BOS], indexing="ij"), -1)  # (R, 2, 2)
        return pick(tf.tensor_scatter_nd_update(log_probs, cells, tf.fill([rows, 2], IMPOSSIBLE)))

    return {
        "vocabulary": (
            _normal(tf, (rows, width), 3),
            {"log_softmax_ban_top1": current, "logits_top1_logsumexp": logits_only,
             "log_softmax_top3_ban": top3},
        ),
        "ban": (
            tf.nn.log_softmax(_normal(tf, (rows, vocabulary), 4)),
            {"select": lambda x: pick(tf.where(banned, IMPOSSIBLE, x)),
             "add_bias": lambda x: pick(x + tf.where(banned, IMPOSSIBLE, 0.0)),
             "scatter": ban_scatter},
        ),
    }  # fmt: skip


def attention_forms(tf, rows, keys, heads=4, head_dim=32):
    """The attention pieces, each with its inputs and forms, the current form first.

    Args:
        tf: the `tensorflow` module.
        rows: int `R`, rows of a step.
        keys: int `S`, keys a query attends.
        heads, head_dim: the model's `H` and `K`.

    Returns:
        `{piece: (inputs, {form: function})}`: `(R, H, 1, S)` logits or
        `(R, H, 1, K)` outputs, as `MultiHeadAttention` computes them for one
        query a row.
    """
    values = attention_values(tf, rows, keys, heads, head_dim)  # (R, H, S, K)

    def weighted_sum(weights):  # (R, H, 1, S) -> (R, H, 1, K), as `_attend` for one query
        return tf.reduce_sum(tf.transpose(weights, (0, 1, 3, 2)) * values, axis=2, keepdims=True)

    return {
        "attention_logits": (
            _normal(tf, (rows, heads, 1, head_dim), 5),
            {"products_and_sums": lambda q: tf.reduce_sum(q * values, axis=-1)[:, :, None],
             "batched_matmul": lambda q: tf.matmul(q, values, transpose_b=True)},
        ),
        "attention_sum": (
            tf.nn.softmax(_normal(tf, (rows, heads, 1, keys), 6)),
            {"products_and_sums": weighted_sum,
             "batched_matmul": lambda weights: tf.matmul(weights, values)},
        ),
    }  # fmt: skip


def looped(tf, function, steps):
    """A `tf.function` running `function` `steps` times, one after another, in a `tf.while_loop`.

    The inputs change a little each step, so that no step is hoisted, and
    each step's output is summed to `(R,)`, the same cost for every form;
    one iteration at a time, as a search's steps run.
    """

    @tf.function
    def run(inputs):
        def body(index, inputs, total):
            outputs = function(inputs)
            reduced = tf.reduce_sum(tf.reshape(outputs, (tf.shape(outputs)[0], -1)), axis=1)
            return index + 1, inputs + 1e-6, total + reduced

        total = tf.zeros(tf.shape(inputs)[:1])
        loop = (0, inputs, total)
        return tf.while_loop(lambda i, *_: i < steps, body, loop, parallel_iterations=1)[2]

    return run


def time_forms(tf, inputs, candidates, steps, repeats):
    """`{form: (median µs a step, same result as the first form)}`, plus the loop alone."""
    import numpy as np

    candidates = {**candidates, "(loop alone)": lambda x: tf.zeros(tf.shape(x)[:1])}
    runs = {name: looped(tf, function, steps) for name, function in candidates.items()}
    for run in runs.values():
        run(inputs)  # tracing, not timed
    outputs = {name: function(inputs).numpy() for name, function in candidates.items()}
    reference = next(iter(outputs.values()))
    times = {name: [] for name in runs}
    names = list(runs)
    for repeat in range(repeats):  # each repeat starts with another form
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            start = time.perf_counter()
            runs[name](inputs).numpy()
            times[name].append((time.perf_counter() - start) / steps * 1e6)
    # Ids must match exactly: a difference of 1 exceeds rtol * V for V < 100,000.
    return {
        name: (
            round(median(times[name]), 1),
            name == "(loop alone)"
            or bool(np.allclose(outputs[name], reference, rtol=1e-5, atol=1e-4)),
        )
        for name in runs
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--keys", type=int, nargs="+", default=[8, 20])
    parser.add_argument("--vocabulary", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=400, help="steps a timed call")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--output", default=os.path.join(RESULTS, "decoding_ops.json"))
    args = parser.parse_args(argv)

    import tensorflow as tf

    results, rows_out = {}, []
    for rows in args.rows:
        # The vocabulary pieces do not depend on the keys: measured once, labelled with the first.
        measured = [(args.keys[0], vocabulary_forms(tf, rows, args.vocabulary))]
        measured += [(keys, attention_forms(tf, rows, keys)) for keys in args.keys]
        for keys, pieces in measured:
            shape = f"rows={rows},keys={keys}"
            for piece, (inputs, candidates) in pieces.items():
                timed = time_forms(tf, inputs, candidates, args.steps, args.repeats)
                for name, (microseconds, same) in timed.items():
                    entry = {"microseconds": microseconds, "same_result": same}
                    results.setdefault(piece, {}).setdefault(name, {})[shape] = entry
                    rows_out.append([piece, name, rows, keys, microseconds, same])
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
