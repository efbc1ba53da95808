"""Recipe arms at equal update counts on a GPU (JAX backend), several seeds at once.

A CPU hour holds one run of the `multi30k` recipe; a GPU holds a dozen at the
same update count in minutes. This study trains the recipe's model with the
recipe's step (`JaxTrainer`: token-exact loss, eq. (3) with its cooldown,
Adam), averages the newest `average_share` of its epoch checkpoints as the
recipe does, and scores val with beam 4, alpha 0.6, so arms and seeds are
compared at equal updates. It does not replace the full hour on 2 cores: a
setting that changes the step's time changes the updates the hour buys.

Two halves, because the GPU machine has no TensorFlow:

    # here: the run's own tokenization (and BPE-dropout copies), saved as NumPy
    python benchmarks/gpu_recipe_study.py prepare --run-dir runs/multi30k \\
        --multi30k-dir ../shared/data/multi30k --output study/examples.npz \\
        [--subword-sampling 0.1]

    # on the GPU machine: one arm, one seed
    KERAS_BACKEND=jax python benchmarks/gpu_recipe_study.py train \\
        --examples study/examples.npz --steps 16080 --seed 0 \\
        [--segmentation sampled] [--set model.dropout=0.3 ...] --output arm.json

Batches are made in NumPy here (not `batching.batch_examples`, which is
tf.data): examples shuffled each pass over the corpus, grouped by the longer
side's length bucket, `batch_tokens // bound` rows a batch, every batch of a
bucket one shape, batches shuffled. The streams differ from the CPU recipe's,
the settings do not. XLA builds one program per shape, so the buckets are
few (`--bucket-ratio` 2: bounds 8, 16, 32, 64, 100), each shape's first
step prints its seconds, and arms run side by side share compiled programs
through JAX's cache (`JAX_COMPILATION_CACHE_DIR`).
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import types

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)


def _ragged(sequences):
    lengths = np.array([len(s) for s in sequences], np.int64)
    return np.concatenate([np.asarray(s, np.int32) for s in sequences]), np.cumsum(lengths)


def _unragged(flat, ends):
    return np.split(flat, ends[:-1])


def prepare(args):
    """Writes the run's tokenized train (and sampled) and val examples as one .npz."""
    from benchmarks import common  # noqa: F401  TensorFlow's environment first
    from pipelines.data import batching, corpus, tokenizer
    from pipelines.training.loading import load_config

    config = load_config(
        config_file=os.path.join(args.run_dir, "config.json"),
        settings={"data.multi30k_dir": args.multi30k_dir},
    )
    spm_path = os.path.join(args.run_dir, "sentencepiece.model")
    tok = tokenizer.load_tokenizer(spm_path)
    length, data = config.batching.max_length, config.data
    train, val = (
        corpus.load_multi30k(args.multi30k_dir, split, data.source_language, data.target_language)
        for split in ("train", "validation")
    )
    with open(spm_path, "rb") as handle:
        arrays = {"sentencepiece": np.frombuffer(handle.read(), np.uint8)}
    examples = {"plain": batching.tokenize_examples(train, tok, length)}
    if args.subword_sampling:
        examples["sampled"] = batching.sampled_examples(
            train, spm_path, length, args.subword_sampling, args.copies, args.seed
        )
    examples["val"] = batching.tokenize_examples(val, tok, length)
    for name, dataset in examples.items():
        rows = list(dataset.as_numpy_iterator())
        for side in ("source", "target"):
            arrays[f"{name}_{side}"], arrays[f"{name}_{side}_ends"] = _ragged(
                [row[side] for row in rows]
            )
    if len(arrays["val_source_ends"]) != len(val):  # the references must match the sources
        raise SystemExit(f"error: val pairs longer than max_length {length}: raise it")
    arrays["val_references"] = np.array([target for _, target in val])
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    np.savez_compressed(args.output, **arrays)
    counts = {name: len(arrays[f"{name}_source_ends"]) for name in examples}
    print(f"wrote {args.output}: examples {counts}")


class Batches:
    """Fixed-shape token-budget batches, read as the trainer reads a dataset.

    Args:
        sources: list of int32 `(S,)` id vectors, each ending with EOS.
        targets: list of int32 `(T + 1,)` id vectors, BOS first and EOS last.
        batch_tokens: int, a batch holds `batch_tokens // bound` rows.
        max_length: int, the last bucket's bound (no example is longer).
        seed: int, the shuffles' seed.
        pad_id: int.
        ratio: float, spacing of the bucket bounds (from 8 to `max_length`).
    """

    def __init__(self, sources, targets, batch_tokens, max_length, seed, pad_id, ratio):
        self.sources, self.targets, self.pad_id = sources, targets, pad_id
        # `batching.bucket_bounds`'s rule; that module needs TensorFlow, absent on the GPU machine.
        self.bounds, bound = [], 8
        while bound < max_length:
            self.bounds.append(bound)
            bound = max(bound + 1, int(bound * ratio))
        self.bounds.append(max_length)
        longer = np.maximum([len(s) for s in sources], [len(t) - 1 for t in targets])
        if longer.max() > max_length:
            raise ValueError(f"examples of {longer.max()} pieces: above max_length {max_length}")
        self.bucket = np.searchsorted(self.bounds, longer, side="left")
        self.sizes = [max(batch_tokens // bound, 1) for bound in self.bounds]
        self.batch_tokens, self.seed, self.skipped = batch_tokens, seed, 0

    def plan(self, number):
        """The batches of one shuffled pass over the corpus, as (bucket, indices) lists."""
        rng = np.random.default_rng([self.seed, number])
        order = rng.permutation(len(self.sources))
        plan = []
        for bucket, size in enumerate(self.sizes):
            members = order[self.bucket[order] == bucket]
            plan += [(bucket, members[i : i + size]) for i in range(0, len(members), size)]
        return [plan[i] for i in rng.permutation(len(plan))]

    def batch(self, bucket, indices):
        """`((source (B, S), target_input (B, T)), target_output (B, T))` of `indices`.

        `S = T` is the bucket's bound and `B` its rows; rows past the
        examples hold padding alone.
        """
        bound, size = self.bounds[bucket], self.sizes[bucket]
        source = np.full((size, bound), self.pad_id, np.int32)
        target = np.full((size, bound + 1), self.pad_id, np.int32)
        for row, index in enumerate(indices):
            source[row, : len(self.sources[index])] = self.sources[index]
            target[row, : len(self.targets[index])] = self.targets[index]
        return (source, target[:, :-1]), target[:, 1:]

    def skip(self, count):
        """Starts the stream `count` batches in (as `tf.data.Dataset.skip`)."""
        self.skipped = count
        return self

    def as_numpy_iterator(self):
        """Batches forever; prints the seconds from each shape's first batch to the next read.

        That is the first step of the shape (its compilation), and at an
        epoch's end the validation and callbacks that follow it.
        """
        number, skipped, seen = 0, self.skipped, set()
        while True:
            for bucket, indices in self.plan(number):
                if skipped:
                    skipped -= 1
                    continue
                started = time.perf_counter()
                yield self.batch(bucket, indices)
                if bucket not in seen:  # the step just taken compiled this shape
                    seen.add(bucket)
                    seconds = time.perf_counter() - started
                    print(
                        f"shape {self.sizes[bucket]}x{self.bounds[bucket]}: {seconds:.1f} s",
                        flush=True,
                    )
            number += 1


class Fixed:
    """A finite list of batches read as the trainer reads validation data."""

    def __init__(self, batches):
        self.batches = batches

    def take(self, count):
        """The first `count` batches (all for a negative count)."""
        return Fixed(self.batches if count < 0 else self.batches[:count])

    def as_numpy_iterator(self):
        """The batches in order."""
        return iter(self.batches)


def _averaging(model, first_epoch):
    """A callback summing the weights at every epoch end from `first_epoch` (1-based) on."""
    import keras

    class Average(keras.callbacks.Callback):
        sums, count = None, 0

        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 < first_epoch:
                return
            weights = [np.asarray(w, np.float64) for w in model.get_weights()]
            if self.sums is not None:
                weights = [a + w for a, w in zip(self.sums, weights, strict=True)]
            self.sums = weights
            self.count += 1

        def average(self):
            return [(s / self.count).astype(np.float32) for s in self.sums]

    return Average()


def _decode(model, processor, sources, beam_size, alpha, batch_size=128):
    """Beam-search translations of `sources` (list of id vectors), detokenized.

    One compiled search (`jax.jit`, the weights as constants) for every
    batch: batches are padded to one shape.
    """
    import jax

    import keras_transformer as kt

    search = jax.jit(lambda ids: kt.beam_search(model, ids, beam_size=beam_size, alpha=alpha)[0])
    longest = max(len(s) for s in sources)
    outputs = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        ids = np.full((batch_size, longest), model.pad_id, np.int32)
        for row, source in enumerate(chunk):
            ids[row, : len(source)] = source
        for row in np.asarray(search(ids))[: len(chunk), 0]:
            row = row.tolist()
            row = row[: row.index(model.eos_id)] if model.eos_id in row else row
            outputs.append(processor.decode([t for t in row if t != model.pad_id]))
    return outputs


def _progress(every=10):
    """A callback printing the epoch, seconds so far and val loss every `every` epochs."""
    import keras

    started = time.perf_counter()

    class Progress(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if (epoch + 1) % every == 0:
                seconds = time.perf_counter() - started
                print(
                    f"epoch {epoch + 1} {seconds:.0f}s val_loss {logs.get('val_loss', 0):.4f}",
                    flush=True,
                )

    return Progress()


def _pipelines_without_tensorflow():
    """Lets the TensorFlow-free modules of `pipelines` load where TensorFlow is not installed.

    `pipelines/__init__.py` refuses to load without TensorFlow, rightly for
    the package; the config, the loop and `JaxTrainer` need none.
    """
    if "pipelines" not in sys.modules and importlib.util.find_spec("tensorflow") is None:
        package = types.ModuleType("pipelines")
        package.__path__ = [os.path.join(ROOT, "pipelines")]
        sys.modules["pipelines"] = package


def _build(config, vocabulary_size, special, steps):
    """The recipe's model, schedule and `JaxTrainer` as `config` sets them, for `steps` updates."""
    import keras

    import keras_transformer as kt
    from pipelines.training.jax_trainer import JaxTrainer

    opt = config.optimization
    if opt.mixed_precision:
        keras.mixed_precision.set_dtype_policy(opt.mixed_precision)
    keras.utils.set_random_seed(opt.seed)
    model = kt.Transformer(**config.model_arguments(vocabulary_size, special))
    model.build(((None, None), (None, None)))
    schedule = kt.TransformerSchedule(
        model.hidden_dim,
        opt.warmup_steps,
        opt.learning_rate_scale,
        total_steps=steps,
        cooldown=opt.cooldown,
    )
    return JaxTrainer(
        model,
        kt.transformer_optimizer(model.hidden_dim, schedule=schedule),
        label_smoothing=opt.label_smoothing,
        accumulation_steps=opt.accumulation_steps,
        schedule=schedule,
    )


def _scores(model, processor, sources, references):
    """Val BLEU, lowercased and cased, greedy and beam 4 (alpha 0.6)."""
    import sacrebleu

    result = {}
    for beam, alpha in ((1, 0.0), (4, 0.6)):
        hypotheses = _decode(model, processor, sources, beam, alpha)
        for case, lowercase in (("lowercased", True), ("cased", False)):
            bleu = sacrebleu.corpus_bleu(hypotheses, [references], lowercase=lowercase)
            result[f"val_bleu_beam{beam}_{case}"] = round(bleu.score, 2)
    return result


def train(args):
    """Trains one arm for `args.steps` updates; writes val loss and BLEU as JSON."""
    _pipelines_without_tensorflow()
    import sentencepiece as spm

    from pipelines.training.checkpoints import checkpoints_to_average
    from pipelines.training.loading import load_config

    settings = dict(item.split("=", 1) for item in args.set)
    # The corpus comes from `--examples`: "default" needs no folder to validate.
    settings = {**settings, "optimization.seed": args.seed, "data.corpus": "default"}
    config = load_config(recipe="multi30k", settings=settings)
    batching, opt = config.batching, config.optimization
    data = np.load(args.examples)
    processor = spm.SentencePieceProcessor(model_proto=data["sentencepiece"].tobytes())
    special = {name: getattr(processor, name)() for name in ("pad_id", "bos_id", "eos_id")}
    side = lambda name: _unragged(data[name], data[f"{name}_ends"])  # noqa: E731
    shape = (batching.batch_tokens, batching.max_length)
    stream = Batches(
        side(f"{args.segmentation}_source"), side(f"{args.segmentation}_target"), *shape,
        args.seed, special["pad_id"], args.bucket_ratio,
    )  # fmt: skip
    count = args.val_sentences
    val_sources, val_targets = side("val_source")[:count], side("val_target")[:count]
    val = Batches(val_sources, val_targets, *shape, 0, special["pad_id"], args.bucket_ratio)
    val = Fixed([val.batch(bucket, indices) for bucket, indices in val.plan(0)])
    trainer = _build(config, processor.get_piece_size(), special, args.steps)
    epochs = math.ceil(args.steps / opt.steps_per_epoch)
    # The epochs whose weights `kt train` would average, by the same rule.
    averaged = checkpoints_to_average(list(range(1, epochs + 1)), config.output)
    average = _averaging(trainer.model, averaged[0])
    started = time.perf_counter()
    history = trainer.fit(
        stream,
        steps=args.steps,
        steps_per_epoch=opt.steps_per_epoch,
        callbacks=[average, _progress()],
        validation_data=val,
        verbose=0,
    ).history
    result = {
        "settings": settings,
        "segmentation": args.segmentation,
        "steps": args.steps,
        "training_seconds": round(time.perf_counter() - started, 1),
        "averaged_checkpoints": average.count,
        "val_loss_last": round(history["val_loss"][-1], 4),
        "val_loss_by_epoch": [round(v, 4) for v in history["val_loss"]],
    }
    trainer.model.set_weights(average.average())
    result["val_loss_averaged"] = round(trainer.evaluate(val)["loss"], 4)
    references = [str(r) for r in data["val_references"]][: len(val_sources)]
    result.update(_scores(trainer.model, processor, val_sources, references))
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "val_loss_by_epoch"}))


def main(argv=None):
    """`prepare` or `train`, as the module's docstring shows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("prepare")
    first.add_argument("--run-dir", required=True)
    first.add_argument("--multi30k-dir", required=True)
    first.add_argument("--output", required=True)
    first.add_argument("--subword-sampling", type=float, default=0.0)
    first.add_argument("--copies", type=int, default=4)
    first.add_argument("--seed", type=int, default=0)
    second = commands.add_parser("train")
    second.add_argument("--examples", required=True)
    second.add_argument("--steps", type=int, required=True)
    second.add_argument("--seed", type=int, default=0)
    second.add_argument("--segmentation", choices=("plain", "sampled"), default="plain")
    second.add_argument("--set", action="append", default=[])
    second.add_argument(
        "--bucket-ratio", type=float, default=2.0,
        help="spacing of the length buckets' bounds (each bound is one shape to compile)",
    )  # fmt: skip
    second.add_argument("--val-sentences", type=int, default=None, help="the first N (all)")
    second.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    (prepare if args.command == "prepare" else train)(args)


if __name__ == "__main__":
    main()
