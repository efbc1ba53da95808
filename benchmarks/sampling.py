"""Sampling against greedy search, per sentence, in-process on one model.

Usage:
    python benchmarks/sampling.py --run-dir runs/multi30k --multi30k-dir ../shared/data/multi30k

Traces `greedy_search`, `sample` (temperature 1, all tokens), `sample`
with `top_p=0.9` and with `top_k=1` (greedy search's outputs, so its cost a
step apart from output lengths) as TensorFlow graphs over the run's model, exports the run
as a SavedModel and calls its `translate` signature with beam 1 (greedy) and
its `sample` signature (per-sentence settings: temperature 1 and all tokens,
then top_k 10), and times each on the same length-sorted batches of
`--batch-size` sources, the passes alternating, the median of `--repeats`.
Writes benchmarks/results/sampling.json.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    export_run,
    load_run,
    median,
    read_parallel,
    table,
    write_result,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    add_parallel_arguments(parser, "val")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(RESULTS, "sampling.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "val")

    import tensorflow as tf

    import keras_transformer as kt
    from pipelines.data.tokenizer import load_tokenizer
    from pipelines.serving.translation import encode

    model, max_length = load_run(args.run_dir)
    tokenizer = load_tokenizer(os.path.join(args.run_dir, "sentencepiece.model"))
    ids = encode(tokenizer, tf.constant(sources), model.eos_id, max_length)
    lengths = ids.row_lengths().numpy()
    order = sorted(range(len(sources)), key=lambda i: lengths[i])
    batches = [
        tf.gather(ids, order[start : start + args.batch_size]).to_tensor(model.pad_id)
        for start in range(0, len(order), args.batch_size)
    ]
    signature = [tf.TensorSpec([None, None], tf.int32)]
    passes = {
        "greedy": tf.function(lambda s: kt.greedy_search(model, s), input_signature=signature),
        "sample": tf.function(lambda s: kt.sample(model, s, seed=1)[0], input_signature=signature),
        "sample_top_p_0.9": tf.function(
            lambda s: kt.sample(model, s, top_p=0.9, seed=1)[0], input_signature=signature
        ),
        # Greedy search's outputs through the sampler: its cost a step, apart from lengths.
        "sample_top_k_1": tf.function(
            lambda s: kt.sample(model, s, top_k=1, seed=1)[0], input_signature=signature
        ),
    }
    # Output tokens of each in-process pass: samples may be longer than greedy outputs.
    output_tokens = {
        name: sum(int(tf.reduce_sum(tf.cast(call(b) != model.pad_id, tf.int32))) for b in batches)
        for name, call in passes.items()
    }
    calls = {name: [(call, batch) for batch in batches] for name, call in passes.items()}
    texts = [
        tf.constant([sources[i] for i in order[start : start + args.batch_size]])
        for start in range(0, len(order), args.batch_size)
    ]
    version = export_run(args.run_dir, tempfile.mkdtemp(), ["translate", "sample"])
    loaded = tf.saved_model.load(version)
    translate, sample = loaded.signatures["translate"], loaded.signatures["sample"]

    def greedy_request(batch):
        return translate(
            inputs=batch, beam_size=tf.constant(1), alpha=tf.constant(0.6),
            penalty_form=tf.constant(""),
        )  # fmt: skip

    def sample_request(top_k):
        def call(batch):
            rows = tf.shape(batch)[0]
            return sample(
                inputs=batch, temperature=tf.ones([rows]), top_k=tf.fill([rows], top_k),
                top_p=tf.ones([rows]), seed=tf.range(tf.cast(rows, tf.int64)),
            )  # fmt: skip

        return call

    requests = {
        "saved_model_greedy": greedy_request,
        "saved_model_sample": sample_request(0),
        "saved_model_sample_top_k_10": sample_request(10),
    }
    calls.update({name: [(call, batch) for batch in texts] for name, call in requests.items()})
    for pairs in calls.values():  # trace, and a first call each
        pairs[0][0](pairs[0][1])
    seconds = {name: [] for name in calls}
    for repeat in range(args.repeats):
        order_of_passes = list(calls) if repeat % 2 == 0 else list(calls)[::-1]
        for name in order_of_passes:
            started = time.perf_counter()
            for call, batch in calls[name]:
                call(batch)
            seconds[name].append(time.perf_counter() - started)
    rates = {name: len(sources) / median(values) for name, values in seconds.items()}
    write_result(
        {
            "benchmark": "sampling",
            "command": "python benchmarks/sampling.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": os.path.abspath(args.run_dir),
            "sentences": len(sources),
            "batch_size": args.batch_size,
            "seconds": {name: [round(s, 3) for s in values] for name, values in seconds.items()},
            "sentences_per_second": {name: round(rate, 1) for name, rate in rates.items()},
            "output_tokens": output_tokens,
            "sample_over_greedy": round(rates["sample"] / rates["greedy"], 3),
            "top_k_1_over_greedy": round(rates["sample_top_k_1"] / rates["greedy"], 3),
            "top_p_over_greedy": round(rates["sample_top_p_0.9"] / rates["greedy"], 3),
            "saved_model_sample_over_greedy": round(
                rates["saved_model_sample"] / rates["saved_model_greedy"], 3
            ),
            "saved_model_top_k_over_greedy": round(
                rates["saved_model_sample_top_k_10"] / rates["saved_model_greedy"], 3
            ),
        },
        args.output,
    )
    print(table(["pass", "sentences / s"], [[n, f"{r:.1f}"] for n, r in rates.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
