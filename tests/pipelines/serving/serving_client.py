"""Loads an exported SavedModel as a serving process would, and reports as JSON.

Run as a script by the export tests: `python serving_client.py EXPORT_DIR INPUTS_JSON`.
It imports only tensorflow and tensorflow_text; keras_transformer and
pipelines are blocked, so the export cannot lean on the project's code.
"""

import importlib.abc
import json
import sys
import threading


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("keras_transformer", "pipelines"):
            raise ImportError(f"{name} must not be imported by a serving process")


sys.meta_path.insert(0, _Block())

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401  registers the SentencePiece ops


def as_lists(tensor):
    """A tensor as nested lists, strings decoded from UTF-8."""
    values = tensor.numpy().tolist()
    if tensor.dtype != tf.string:
        return values

    def text(value):
        return [text(v) for v in value] if isinstance(value, list) else value.decode("utf-8")

    return text(values)


def main(export_dir, inputs_path):
    with open(inputs_path, encoding="utf-8") as handle:
        # Strings as latin-1 code points so any byte (invalid UTF-8 too) survives JSON.
        inputs = [text.encode("latin-1") for text in json.load(handle)]
    loaded = tf.saved_model.load(export_dir)
    serve = loaded.signatures["serving_default"]
    nbest = loaded.signatures["nbest"]

    def call(batch):
        outputs = serve(inputs=tf.constant(batch, tf.string))
        return [t.decode("utf-8") for t in outputs["translations"].numpy()], [
            float(s) for s in outputs["scores"].numpy()
        ]

    translations, scores = call(inputs)
    alone = [call([text])[0][0] for text in inputs]
    best = nbest(inputs=tf.constant(inputs, tf.string))
    empty = serve(inputs=tf.constant([], tf.string))["translations"].shape[0]
    greedy = loaded.signatures["translate"](
        inputs=tf.constant(inputs, tf.string),
        beam_size=tf.constant(1),
        alpha=tf.constant(0.6),
        penalty_form=tf.constant(""),
    )
    # Beam search's best translations (alpha 0) scored back, and reversed pairs.
    beam = loaded.signatures["translate"](
        inputs=tf.constant(inputs, tf.string),
        beam_size=tf.constant(4),
        alpha=tf.constant(0.0),
        penalty_form=tf.constant(""),
    )
    scored = loaded.signatures["score"](
        sources=tf.constant(inputs, tf.string), targets=beam["translations"]
    )

    # Prefixes (the first few characters of the beam's own translations, and
    # none for every other sentence) and alignments.
    prefixes = [text[:5] if i % 2 else b"" for i, text in enumerate(beam["translations"].numpy())]
    prefixed = loaded.signatures["prefix"](
        inputs=tf.constant(inputs, tf.string), prefixes=tf.constant(prefixes)
    )
    aligned = loaded.signatures["align"](
        inputs=tf.constant(inputs, tf.string), prefixes=tf.constant(prefixes)
    )

    # Samples: top_k 1 for every sentence, then seeds and settings per sentence.
    rows = len(inputs)

    def sample(batch, top_k, seeds, temperature=1.0):
        outputs = loaded.signatures["sample"](
            inputs=tf.constant(batch, tf.string),
            temperature=tf.fill([len(batch)], temperature),
            top_k=tf.constant(top_k, tf.int32),
            top_p=tf.fill([len(batch)], 0.95),
            seed=tf.constant(seeds, tf.int64),
        )
        return [t.decode("utf-8") for t in outputs["translations"].numpy()], outputs

    top_1, _ = sample(inputs, [1] * rows, list(range(rows)))
    samples, sampled = sample(inputs, [0] * rows, list(range(rows)), temperature=2.0)
    reversed_samples, _ = sample(inputs[::-1], [0] * rows, list(range(rows))[::-1], 2.0)
    other_seeds, _ = sample(inputs, [0] * rows, list(range(100, 100 + rows)), temperature=2.0)

    # Decoding controls, all off: serving_default's translations.
    neutral = {
        "no_repeat_ngram_size": tf.zeros([rows], tf.int32),
        "repetition_penalty": tf.ones([rows]),
        "min_length": tf.zeros([rows], tf.int32),
        "max_length": tf.zeros([rows], tf.int32),
        "disable_unk": tf.zeros([rows], tf.bool),
        "banned_words": tf.fill([rows], ""),
    }
    controlled = loaded.signatures["controlled"](inputs=tf.constant(inputs, tf.string), **neutral)

    # Eight threads call the signature at once, each on its own slice of inputs.
    batches = [inputs[i:] + inputs[:i] for i in range(8)]
    sequential = [call(batch)[0] for batch in batches]
    threaded = [None] * 8

    def worker(index):
        for _ in range(3):
            threaded[index] = call(batches[index])[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    json.dump(
        {
            "signatures": sorted(loaded.signatures),
            "translations": translations,
            "scores": scores,
            "alone": alone,
            "nbest": [[t.decode("utf-8") for t in row] for row in best["translations"].numpy()],
            "nbest_scores": best["scores"].numpy().tolist(),
            "empty_batch_rows": empty,
            "greedy": [t.decode("utf-8") for t in greedy["translations"].numpy()],
            "greedy_scores": greedy["scores"].numpy().tolist(),
            "beam_alpha0_translations": [t.decode("utf-8") for t in beam["translations"].numpy()],
            "beam_alpha0_scores": beam["scores"].numpy().tolist(),
            "scored": scored["scores"].numpy().tolist(),
            "scored_lengths": scored["lengths"].numpy().tolist(),
            "threads_equal_sequential": threaded == sequential,
            "prefixes": [text.decode("utf-8") for text in prefixes],
            "prefixed": [t.decode("utf-8") for t in prefixed["translations"].numpy()],
            "prefixed_scores": prefixed["scores"].numpy().tolist(),
            "aligned": {key: as_lists(value) for key, value in aligned.items()},
            "sampled_top_1": top_1,
            "sampled": samples,
            "sampled_scores": sampled["scores"].numpy().tolist(),
            "sampled_reversed": reversed_samples[::-1],
            "sampled_other_seeds": other_seeds,
            "controlled_neutral": [t.decode("utf-8") for t in controlled["translations"].numpy()],
            "asset": loaded.sentencepiece_model.asset_path.numpy().decode(),
            "modules": sorted(
                name
                for name in sys.modules
                if name.split(".")[0] in ("keras_transformer", "pipelines")
            ),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
