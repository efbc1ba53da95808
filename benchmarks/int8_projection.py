"""The tied output projection in int8: what each way of computing it costs on this CPU.

Usage:
    python benchmarks/int8_projection.py [--vocabulary-size 10000] [--hidden-dim 512]
        [--rows 4 64 256] [--repeats 20]

A decoding step projects its rows (sentences times beams) onto the whole
vocabulary. With int8 embeddings (`kt export --quantize`), `TokenEmbedding`
casts its int8 table to float32 and multiplies in float32. The alternatives
that leave the table in int8 quantize the rows too and multiply int8 by int8
(Keras's `ops.matmul` on two int8 tensors runs TensorFlow's int8 kernel with
int32 results), with the table transposed on each call or stored transposed
once. Each case is a `tf.function` over `keras.ops`, timed by
`common.time_cases` (cases interleaved, median of `--repeats`); the error is
the largest difference from float32's logits, over the largest float32 logit.
Writes benchmarks/results/int8_projection.json.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, time_cases, write_result  # noqa: E402

CASES = ("float32", "int8_table_cast", "int8_matmul_transposed", "int8_matmul_stored")


def projections(vocabulary_size, hidden_dim, seed=0):
    """`{case: tf.function(rows (N, D) float32) -> logits (N, V) float32}` over one table."""
    import keras
    import tensorflow as tf
    from keras import ops

    from keras_transformer.layers import TokenEmbedding

    keras.utils.set_random_seed(seed)
    embedding = TokenEmbedding(vocabulary_size, hidden_dim)
    embedding.build()
    table = ops.convert_to_tensor(embedding.embeddings)
    quantized = TokenEmbedding(vocabulary_size, hidden_dim)
    quantized.build()
    quantized.set_weights(embedding.get_weights())
    quantized.quantize("int8")
    values, scale = quantized.embeddings, quantized.embeddings_scale  # (V, D) int8, (V,)
    stored = tf.Variable(ops.transpose(values))  # (D, V) int8, written once

    def int8_matmul(rows, table_t):
        q_rows, row_scale = keras.quantizers.abs_max_quantize(rows, axis=-1)  # (N, D), (N, 1)
        logits = ops.cast(ops.matmul(q_rows, table_t), "float32")  # int32 (N, V)
        return logits / row_scale / scale

    return {
        "float32": tf.function(lambda rows: ops.matmul(rows, ops.transpose(table))),
        "int8_table_cast": tf.function(lambda rows: quantized(rows[:, None], reverse=True)[:, 0]),
        "int8_matmul_transposed": tf.function(
            lambda rows: int8_matmul(rows, ops.transpose(values))
        ),
        "int8_matmul_stored": tf.function(lambda rows: int8_matmul(rows, stored)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary-size", type=int, default=10000)
    parser.add_argument("--hidden-dim", type=int, default=512)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 64, 256])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", default=os.path.join(RESULTS, "int8_projection.json"))
    args = parser.parse_args(argv)
    import numpy as np

    functions = projections(args.vocabulary_size, args.hidden_dim)
    rng = np.random.default_rng(1)
    inputs = {n: rng.normal(size=(n, args.hidden_dim)).astype("float32") for n in args.rows}
    cases = [(name, n) for n in args.rows for name in CASES]
    seconds, outputs = time_cases(
        lambda case: np.asarray(functions[case[0]](inputs[case[1]])), cases, args.repeats
    )
    results, rows = {}, []
    for n in args.rows:
        reference = outputs[("float32", n)]
        base = median(seconds[("float32", n)])
        for name in CASES:
            value = median(seconds[(name, n)])
            error = np.abs(outputs[(name, n)] - reference).max()
            results[f"{name}_{n}"] = {
                "milliseconds": 1000 * value,
                "over_float32": value / base,
                "relative_error": float(error / np.abs(reference).max()),
            }
            rows.append([n, name, f"{1000 * value:.2f}", f"{value / base:.2f}x"])
    print(table(["rows", "projection", "ms", "time over float32"], rows))
    result = {"vocabulary_size": args.vocabulary_size, "hidden_dim": args.hidden_dim,
              "repeats": args.repeats, "results": results}  # fmt: skip
    write_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
