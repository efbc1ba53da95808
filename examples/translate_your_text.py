"""From your own sentence pairs to a served translation, in one Keras script, on any backend.

    KERAS_BACKEND=jax python examples/translate_your_text.py \\
        --source train.en.gz --target train.de.gz --output-dir my-model

1. trains a SentencePiece vocabulary with the model's ids (`keras_transformer.tokenizers`);
2. turns the pairs into arrays and trains a small Transformer with `model.fit`;
3. translates held-out sentences with beam search and turns the ids back into text;
4. saves `model.keras` and `vocab.model`, which `kt export --model OUTPUT/model.keras
   --sentencepiece OUTPUT/vocab.model` makes a SavedModel for TF Serving; with `--export`
   it runs that command (it needs the TensorFlow extra) and translates with the SavedModel.

The input is two aligned text files (plain or .gz), one sentence a line, such as
Multi30k's `train.en.gz` and `train.de.gz`. The defaults fit a laptop's minutes; the
paper's sizes are `Transformer.from_preset("transformer_base", ...)` and many more steps.
"""

import argparse
import gzip
import itertools
import os
import subprocess
import sys

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.tokenizers import train_sentencepiece


def read_lines(path, count):
    """The first `count` lines of a text file (plain or .gz), without their line ends."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, count)]


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--target", required=True, help="their translations, aligned")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--pairs", type=int, default=10000, help="pairs read from the files")
    parser.add_argument("--held-out", type=int, default=8, help="the last pairs, translated")
    parser.add_argument("--vocabulary-size", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=48, help="ids a sentence keeps")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--export", action="store_true", help="also run kt export and serve")
    return parser.parse_args(argv)


def train(args, train_pairs):
    """The vocabulary and the model trained on `train_pairs`: `(tokenizer, model)`."""
    sources, targets = [s for s, _ in train_pairs], [t for _, t in train_pairs]
    tokenizer = train_sentencepiece(
        iter(sources + targets), os.path.join(args.output_dir, "vocab.model"),
        vocabulary_size=args.vocabulary_size,
    )  # fmt: skip
    source_ids = tokenizer.encode_sources(sources, args.max_length)
    decoder_inputs, labels = tokenizer.encode_targets(targets, args.max_length)
    model = kt.Transformer.from_preset(
        "transformer_small", vocabulary_size=tokenizer.vocabulary_size,
        num_layers=args.layers, hidden_dim=args.hidden_dim,
        intermediate_dim=4 * args.hidden_dim, num_heads=4,
    )  # fmt: skip
    steps = args.epochs * -(-len(train_pairs) // args.batch_size)
    model.compile(
        optimizer=kt.transformer_optimizer(
            hidden_dim=args.hidden_dim, warmup_steps=max(1, steps // 10)
        ),
        loss=kt.LabelSmoothedCrossEntropy(label_smoothing=0.1),
        metrics=[kt.MaskedAccuracy()],
    )
    model.fit(
        (source_ids, decoder_inputs), labels, batch_size=args.batch_size, epochs=args.epochs,
        verbose=2,
    )  # fmt: skip
    return tokenizer, model


def serve(args, sentences):
    """`kt export` of the saved model, then the SavedModel's translations of `sentences` and
    their scores."""
    import tensorflow as tf  # the TensorFlow extra
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the SavedModel runs)

    base = os.path.join(args.output_dir, "saved_models")
    command = [sys.executable, "-m", "pipelines", "export", "--base", base, "--name", "mine",
               "--model", os.path.join(args.output_dir, "model.keras"),
               "--sentencepiece", os.path.join(args.output_dir, "vocab.model"),
               "--max-source-length", str(args.max_length)]  # fmt: skip
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow"}  # the export is a TF graph
    subprocess.run(command, check=True, env=environment)
    folder = os.path.join(base, "mine")  # kt export writes the next free version: the newest
    version = os.path.join(folder, str(max(int(v) for v in os.listdir(folder) if v.isdigit())))
    print(f"SavedModel: {version}")
    served = tf.saved_model.load(version)
    outputs = served.signatures["serving_default"](inputs=tf.constant(sentences))
    texts = [text.decode("utf-8") for text in outputs["translations"].numpy()]
    return texts, outputs["scores"].numpy()


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    sources, targets = read_lines(args.source, args.pairs), read_lines(args.target, args.pairs)
    if len(sources) != len(targets):
        raise SystemExit(
            f"{args.source} has {len(sources)} lines and {args.target} {len(targets)}: "
            "the files must be aligned, one pair a line"
        )
    pairs = list(zip(sources, targets, strict=True))
    train_pairs, held_out = pairs[: -args.held_out], pairs[-args.held_out :]
    tokenizer, model = train(args, train_pairs)
    model.save(os.path.join(args.output_dir, "model.keras"))

    sources = [source for source, _ in held_out]
    source_ids = tokenizer.encode_sources(sources, args.max_length)
    best, scores = kt.beam_search(model, source_ids, beam_size=4, alpha=0.6)  # (B, 1, T), (B, 1)
    translations = [hypotheses[0] for hypotheses in tokenizer.decode(best)]
    for source, translation in zip(sources, translations, strict=True):
        print(f"{source}\n  -> {translation}")
    print(f"backend {keras.backend.backend()}: {args.output_dir}/model.keras, vocab.model")
    result = {"translations": translations, "scores": keras.ops.convert_to_numpy(scores)[:, 0]}
    if args.export:
        result["served"], result["served_scores"] = serve(args, sources)
        agree = np.mean([a == b for a, b in zip(translations, result["served"], strict=True)])
        print(f"the SavedModel gives the same translation for {agree:.0%} of them")
    return result


if __name__ == "__main__":
    main()
