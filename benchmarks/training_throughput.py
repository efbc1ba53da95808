"""Training throughput: our Transformer vs the same model composed from keras-hub layers.

Usage:
    python benchmarks/training_throughput.py --multi30k-dir ../shared/data/multi30k \
        [--repeats 5] [--batches 24] [--num-layers 3 --hidden-dim 256 ...]

Both models have the same size: shared source/target/output embeddings scaled
by sqrt(D), sinusoidal positions, post-norm encoder and decoder layers
(keras_hub.layers.ReversibleEmbedding, SinePositionEncoding,
TransformerEncoder, TransformerDecoder for the composition). Both train on the
same Multi30k batches (our bucketed token-budget batches, read once into
memory) with the same step: label-smoothed loss, Adam, one `tf.function`.
Each repetition times one pass over the batches per model, alternating which
goes first; throughput is non-pad source + target tokens per second, median
over repetitions.

Model FLOP utilisation: model FLOPs counted from the batches' real lengths
(projections, feed-forward, attention scores and values, output layer;
backward = 2 x forward) per second, over the peak float32 matmul rate timed in
the same run (the best of square matmuls of a few sizes). The usual
6 x parameters x tokens estimate is reported beside it.

Writes benchmarks/results/training_throughput.json and prints a table.
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, write_result  # noqa: E402


def hub_transformer(vocabulary_size, num_layers, hidden_dim, intermediate_dim, num_heads, dropout):
    """Our architecture composed from keras-hub layers, as a functional model."""
    import keras
    import keras_hub
    from keras import ops

    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    embedding = keras_hub.layers.ReversibleEmbedding(vocabulary_size, hidden_dim)
    positions = keras_hub.layers.SinePositionEncoding()
    layer_arguments = {
        "intermediate_dim": intermediate_dim,
        "num_heads": num_heads,
        "dropout": dropout,
        "layer_norm_epsilon": 1e-6,
    }

    def embed(ids):
        x = embedding(ids) * math.sqrt(hidden_dim)
        return keras.layers.Dropout(dropout)(x + positions(x))

    source_mask = ops.not_equal(source, 0)
    target_mask = ops.not_equal(target, 0)
    x = embed(source)
    for _ in range(num_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_arguments)(x, padding_mask=source_mask)
    y = embed(target)
    for _ in range(num_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_arguments)(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask
        )
    logits = embedding(y, reverse=True)
    return keras.Model((source, target), logits, name="keras_hub_transformer")


def our_transformer(vocabulary_size, num_layers, hidden_dim, intermediate_dim, num_heads, dropout):
    import numpy as np

    from keras_transformer import Transformer

    model = Transformer(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim,
        num_heads=num_heads,
        dropout=dropout,
    )
    model((np.ones((1, 4), "int32"), np.ones((1, 4), "int32")))
    return model


def make_step(model):
    """One training step as a `tf.function`: label-smoothed loss, Adam update."""
    import keras
    import tensorflow as tf

    from keras_transformer.losses import LabelSmoothedCrossEntropy

    loss = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    optimizer = keras.optimizers.Adam(1e-4, beta_2=0.98, epsilon=1e-9)
    optimizer.build(model.trainable_variables)

    @tf.function(reduce_retracing=True)
    def step(source, target_in, target_out):
        with tf.GradientTape() as tape:
            logits = model((source, target_in), training=True)
            loss_sum, tokens = loss.token_sums(target_out, logits)
            value = loss_sum / tokens
        gradients = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return value

    return step


def read_batches(multi30k_dir, work_dir, count, batch_tokens, vocabulary_size, sentences=None):
    """`count` shuffled Multi30k training batches as NumPy triples."""
    from pipelines.data import batching, tokenizer
    from pipelines.data.corpus import load_multi30k

    pairs = load_multi30k(multi30k_dir, "train")[:sentences]
    spm_path = os.path.join(work_dir, "sentencepiece.model")
    tokenizer.train_sentencepiece([t for pair in pairs for t in pair], spm_path, vocabulary_size)
    dataset = batching.make_dataset(
        pairs, tokenizer.load_tokenizer(spm_path), batch_tokens, max_length=100, seed=0
    )
    batches = [
        (source.numpy(), target_in.numpy(), target_out.numpy())
        for (source, target_in), target_out in dataset.take(count)
    ]
    return batches, tokenizer.vocabulary_size(spm_path)


def model_flops(batch, num_layers, hidden_dim, intermediate_dim, vocabulary_size):
    """Training FLOPs of one batch, from its real (non-pad) lengths."""
    import numpy as np

    source, target_in, _ = batch
    s = np.sum(source != 0, axis=1).astype(np.float64)  # (B,)
    t = np.sum(target_in != 0, axis=1).astype(np.float64)
    d, f = hidden_dim, intermediate_dim
    encoder = np.sum(s * (4 * d * d + 2 * d * f) + 2 * s * s * d)
    decoder = np.sum(
        t * (6 * d * d + 2 * d * f)  # self-attention Q/K/V/O, cross-attention Q/O, feed-forward
        + s * 2 * d * d  # cross-attention K/V of the encoder outputs
        + 2 * t * t * d  # self-attention scores and values
        + 2 * t * s * d  # cross-attention scores and values
    )
    output = np.sum(t) * d * vocabulary_size
    multiply_adds = num_layers * (encoder + decoder) + output
    return 3 * 2 * multiply_adds  # forward + backward (2 x forward), 2 FLOPs a multiply-add


def matmul_peak(sizes=(1024, 2048, 4096), repeats=5):
    """The best float32 FLOP/s of square `tf.matmul`s (median over repeats, max over sizes)."""
    import tensorflow as tf

    rates = {}
    for n in sizes:
        a = tf.random.normal((n, n))
        b = tf.random.normal((n, n))
        matmul = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)))
        matmul(a, b).numpy()
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            matmul(a, b).numpy()
            seconds.append(time.perf_counter() - started)
        rates[n] = 2 * n**3 / median(seconds)
    return max(rates.values()), rates


def time_pass(step, batches):
    started = time.perf_counter()
    for batch in batches:
        value = step(*batch)
    float(value)
    return time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--sentences", type=int, help="use only the first N training pairs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=24, help="batches per timed pass")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--intermediate-dim", type=int, default=1024)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--matmul-sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--output", default=os.path.join(RESULTS, "training_throughput.json"))
    args = parser.parse_args(argv)

    import tempfile

    import keras
    import numpy as np

    with tempfile.TemporaryDirectory() as work_dir:
        batches, vocabulary_size = read_batches(
            args.multi30k_dir,
            work_dir,
            args.batches,
            args.batch_tokens,
            args.vocabulary_size,
            args.sentences,
        )
    size = {
        "num_layers": args.num_layers,
        "hidden_dim": args.hidden_dim,
        "intermediate_dim": args.intermediate_dim,
        "num_heads": args.num_heads,
        "dropout": args.dropout,
    }
    models, steps = {}, {}
    for name, build in (("ours", our_transformer), ("keras_hub", hub_transformer)):
        keras.utils.set_random_seed(0)
        models[name] = build(vocabulary_size, **size)
        steps[name] = make_step(models[name])
        time_pass(steps[name], batches)  # tracing, not timed
    parameters = {name: int(model.count_params()) for name, model in models.items()}
    tokens = int(sum(np.sum(s != 0) + np.sum(t != 0) for s, t, _ in batches))
    flops = sum(
        model_flops(b, args.num_layers, args.hidden_dim, args.intermediate_dim, vocabulary_size)
        for b in batches
    )
    peak, peak_by_size = matmul_peak(args.matmul_sizes)

    seconds = {name: [] for name in models}
    for repeat in range(args.repeats):
        order = list(models) if repeat % 2 == 0 else list(models)[::-1]
        for name in order:
            seconds[name].append(time_pass(steps[name], batches))
            print(f"repeat {repeat}: {name}: {tokens / seconds[name][-1]:.0f} tokens/s", flush=True)
    peak_after, _ = matmul_peak(args.matmul_sizes)
    peak = max(peak, peak_after)

    results, rows = {}, []
    for name in models:
        elapsed = median(seconds[name])
        achieved = flops / elapsed
        estimate = 6 * parameters[name] * tokens / elapsed
        results[name] = {
            "parameters": parameters[name],
            "seconds_per_pass": [round(s, 3) for s in seconds[name]],
            "tokens_per_second": round(tokens / elapsed, 1),
            "model_flops_per_second": round(achieved),
            "mfu": round(achieved / peak, 4),
            "mfu_6n": round(estimate / peak, 4),
        }
        rows.append([name, f"{parameters[name]:,}", f"{tokens / elapsed:,.0f}",
                     f"{achieved / 1e9:.1f}", f"{achieved / peak:.1%}"])  # fmt: skip
    speedup = median(seconds["keras_hub"]) / median(seconds["ours"])
    write_result(
        {
            "benchmark": "training_throughput",
            "command": "python benchmarks/training_throughput.py " + " ".join(argv or sys.argv[1:]),
            "model": size,
            "vocabulary_size": vocabulary_size,
            "batches": len(batches),
            "batch_tokens": args.batch_tokens,
            "tokens_per_pass": tokens,
            "flops_per_pass": flops,
            "repeats": args.repeats,
            "matmul_peak_flops_per_second": round(peak),
            "matmul_flops_per_second_by_size": {str(n): round(r) for n, r in peak_by_size.items()},
            "results": results,
            "speedup_over_keras_hub": round(speedup, 3),
        },
        args.output,
    )
    print(table(["model", "parameters", "tokens/s", "model GFLOP/s", "MFU"], rows))
    print(f"matmul peak {peak / 1e9:.1f} GFLOP/s; ours / keras-hub: {speedup:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
