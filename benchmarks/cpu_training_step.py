"""The Multi30k recipe's training step on CPU: today's step vs an XLA-compiled one.

Usage:
    python benchmarks/cpu_training_step.py --multi30k-dir ../shared/data/multi30k \
        [--batches 24] [--repeats 3] [--variants xla fused_adam keras_attention bfloat16]

Each variant trains the recipe's model (`multi30k`: 4 layers, width 128,
feed-forward 256, 4 heads, joint vocabulary 8,000) with the product's
`Trainer` on the same training examples:
- `today`: the recipe's batches (per-side length buckets spaced by 1.1, about
  `--batch-tokens` tokens a side), eager TensorFlow graphs, oneDNN;
- `xla`: `jit_compile=True` over a small set of fixed shapes: buckets spaced
  by `--xla-ratio`, each batch padded to its bucket's bounds and to the
  bucket's full row count, so each (source bound, target bound) pair is one
  compiled program. Padding costs compute; compiling costs time once per
  shape;
- `fused_adam`: today's step with `pipelines.training.optimizers.FusedAdam`
  (one `ResourceApplyAdam` kernel a variable instead of Keras's ~20 ops);
- `keras_attention`: today's step with attention through
  `keras.ops.dot_product_attention` (which TensorFlow computes as einsums on
  the `(B, T, H, K)` layout with masks materialized at the logits' full
  shape) instead of the layer's step-by-step path on TensorFlow (heads-first
  products, the mask broadcast in `where`): `fused_attention=True`.
Each repetition times one pass over the same examples per variant,
alternating which goes first; the rate is real (non-pad) target tokens per
second, median over repetitions. The compile cost is the first step of each
new shape minus a steady step, and the number of shapes is counted over a
whole training epoch, so the table says what a 57-minute budget would lose
to compiling. Today's step is also profiled (TensorFlow profiler, op time by
kind, as benchmarks/decoding_profile.py does) over `--profile-steps` steps.
Writes benchmarks/results/cpu_training_step.json.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, write_result  # noqa: E402

MODEL = {"num_layers": 4, "hidden_dim": 128, "intermediate_dim": 256, "num_heads": 4}
VARIANTS = ("xla", "fused_adam", "keras_attention", "bfloat16")


def examples_and_vocabulary(multi30k_dir, work_dir, vocabulary_size, max_length, sentences):
    from pipelines.data import batching, tokenizer
    from pipelines.data.corpus import load_multi30k

    pairs = load_multi30k(multi30k_dir, "train")[:sentences]
    spm_path = os.path.join(work_dir, "sentencepiece.model")
    tokenizer.train_sentencepiece([t for pair in pairs for t in pair], spm_path, vocabulary_size)
    tok = tokenizer.load_tokenizer(spm_path)
    examples = batching.tokenize_examples(pairs, tok, max_length).cache()
    return examples, tokenizer.vocabulary_size(spm_path)


def batches(examples, batch_tokens, max_length, ratio, fixed):
    """Shuffled training batches as NumPy triples; `fixed` pads to bucket shapes."""
    import numpy as np

    from pipelines.data import batching

    dataset = examples.shuffle(100_000, seed=0).apply(
        batching.bucket_by_token_budget(batch_tokens, max_length, ratio)
    )
    bounds = np.array(batching.bucket_bounds(max_length, ratio))
    for batch in dataset.as_numpy_iterator():
        source, target = batch["source"], batch["target"]
        if fixed:
            s = bounds[np.searchsorted(bounds, source.shape[1])]
            t = bounds[np.searchsorted(bounds, target.shape[1] - 1)]
            rows = batch_tokens // max(s, t)
            source = np.pad(source, ((0, rows - len(source)), (0, s - source.shape[1])))
            target = np.pad(target, ((0, rows - len(target)), (0, t + 1 - target.shape[1])))
        yield source, target[:, :-1], target[:, 1:]


def attention_layers(model):
    """Every `MultiHeadAttention` of a `Transformer`, through its public sublayers."""
    for stack in (model.encoder, model.decoder):
        for layer in stack.stack_layers:
            yield layer.self_attention
            if hasattr(layer, "cross_attention"):
                yield layer.cross_attention


def make_trainer(
    vocabulary_size, num_layers, xla=False, fused_adam=False, keras_attention=False, bfloat16=False
):
    import keras

    import keras_transformer as kt
    from pipelines.training.optimizers import FusedAdam
    from pipelines.training.trainer import Trainer

    keras.utils.set_random_seed(0)
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16" if bfloat16 else "float32")
    try:
        model = kt.Transformer(vocabulary_size, dropout=0.1, **{**MODEL, "num_layers": num_layers})
        model.build(((None, None), (None, None)))
    finally:
        keras.config.set_dtype_policy(policy)
    if keras_attention:  # the benchmark's model: no attention dropout, float32
        for attention in attention_layers(model):
            attention.fused_attention = True
    adam = FusedAdam if fused_adam else keras.optimizers.Adam
    optimizer = kt.transformer_optimizer(model.hidden_dim, 400, 0.5, optimizer_class=adam)
    return Trainer(model, optimizer, jit_compile=xla)


def one_step(trainer, batch):
    import tensorflow as tf

    from pipelines.training.streams import TensorStream

    source, target_in, target_out = batch
    data = tf.data.Dataset.from_tensors(((source, target_in), target_out))
    return float(trainer.train_step(TensorStream(data))[1])  # real target tokens


def time_pass(trainer, batch_list):
    started, tokens = time.perf_counter(), 0.0
    for batch in batch_list:
        tokens += one_step(trainer, batch)
    return tokens / (time.perf_counter() - started)


def profile_steps(trainer, batch_list):
    """Op time per step by kind and the top op types, in milliseconds."""
    import collections
    import glob

    import tensorflow as tf

    from benchmarks.decoding_profile import kind_of, op_times

    with tempfile.TemporaryDirectory() as log_dir:
        tf.profiler.experimental.start(log_dir)
        for batch in batch_list:
            one_step(trainer, batch)
        tf.profiler.experimental.stop()
        path = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))
        seconds, _ = op_times(path[-1])
    per_step = 1000.0 / len(batch_list)
    kinds = collections.Counter()
    for op_type, value in seconds.items():
        kinds[kind_of(op_type)] += value * per_step
    return {
        "op_ms_per_step_by_kind": {k: round(v, 1) for k, v in kinds.most_common()},
        "top_ops_ms_per_step": {k: round(v * per_step, 1) for k, v in seconds.most_common(12)},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--batches", type=int, default=24, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--xla-ratio", type=float, default=1.5)
    parser.add_argument("--profile-steps", type=int, default=6)
    parser.add_argument("--sentences", type=int, help="use only the first N training pairs")
    parser.add_argument("--num-layers", type=int, default=MODEL["num_layers"])
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
        help="measured beside today's step",
    )  # fmt: skip
    parser.add_argument("--output", default=os.path.join(RESULTS, "cpu_training_step.json"))
    args = parser.parse_args(argv)
    max_length = 100

    with tempfile.TemporaryDirectory() as work_dir:
        examples, vocabulary = examples_and_vocabulary(
            args.multi30k_dir, work_dir, args.vocabulary_size, max_length, args.sentences
        )
    # name: bucket ratio, then `make_trainer` options; only XLA pads to fixed shapes.
    known = {
        "today": (1.1, {}),
        "xla": (args.xla_ratio, {"xla": True}),
        "fused_adam": (1.1, {"fused_adam": True}),
        "keras_attention": (1.1, {"keras_attention": True}),
        "bfloat16": (1.1, {"bfloat16": True}),
    }
    variants = {name: known[name] for name in ["today", *args.variants] if name in known}
    epoch, timed, shapes, padding = {}, {}, {}, {}
    for name, (ratio, options) in variants.items():
        fixed = options.get("xla", False)
        epoch[name] = list(batches(examples, args.batch_tokens, max_length, ratio, fixed))
        shapes[name] = len({(b[0].shape, b[1].shape) for b in epoch[name]})
        real = sum(int((b[2] != 0).sum()) for b in epoch[name])
        padding[name] = round(real / sum(b[2].size for b in epoch[name]), 3)
        timed[name] = epoch[name][: args.batches]
    trainers = {
        name: make_trainer(vocabulary, args.num_layers, **options)
        for name, (_, options) in variants.items()
    }

    # Compile (or trace) cost: first step of a shape minus a steady step of it.
    first_step = {}
    for name, trainer in trainers.items():
        batch = timed[name][0]
        started = time.perf_counter()
        one_step(trainer, batch)
        first = time.perf_counter() - started
        started = time.perf_counter()
        one_step(trainer, batch)
        first_step[name] = round(first - (time.perf_counter() - started), 1)
        for batch in timed[name]:  # every timed shape traced or compiled before timing
            one_step(trainer, batch)

    rates = {name: [] for name in variants}
    for repeat in range(args.repeats):
        order = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
        for name in order:
            rates[name].append(round(time_pass(trainers[name], timed[name]), 1))

    results = {}
    for name in variants:
        rate = median(rates[name])
        epoch_tokens = sum(int((b[2] != 0).sum()) for b in epoch[name])
        results[name] = {
            "real_target_tokens_per_second": rates[name],
            "median": rate,
            "compute_dtype": trainers[name].model.compute_dtype,
            "shapes_per_epoch": shapes[name],
            "real_token_fraction": padding[name],
            "first_step_extra_seconds": first_step[name],
            "epoch_minutes": round(epoch_tokens / rate / 60, 2),
            # Compiling each shape once (XLA) or tracing once (today: one
            # relaxed trace) out of a 57-minute budget.
            "compile_minutes_per_run": round(
                (shapes[name] if name == "xla" else 1) * first_step[name] / 60, 1
            ),
        }
    over_today = {
        f"{name}_over_today_steady": round(results[name]["median"] / results["today"]["median"], 3)
        for name in variants
        if name != "today"
    }
    profile = profile_steps(trainers["today"], timed["today"][: args.profile_steps])
    result = write_result(
        {
            "benchmark": "cpu_training_step",
            "command": "python benchmarks/cpu_training_step.py " + " ".join(argv or sys.argv[1:]),
            "model": {**MODEL, "num_layers": args.num_layers},
            "vocabulary_size": vocabulary,
            "batch_tokens": args.batch_tokens,
            "xla_bucket_ratio": args.xla_ratio,
            "batches_per_pass": args.batches,
            "repeats": args.repeats,
            "results": results,
            **over_today,
            "today_profile": profile,
        },
        args.output,
    )
    header = ["variant", "real tokens/s", "real fraction", "shapes/epoch", "compile min/run"]
    rows = [
        [name, r["median"], r["real_token_fraction"], r["shapes_per_epoch"],
         r["compile_minutes_per_run"]]
        for name, r in result["results"].items()
    ]  # fmt: skip
    print(table(header, rows))
    for name, ratio in over_today.items():
        print(f"{name} (steady state, real tokens): {ratio:.3f}")
    print(json.dumps(profile, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
