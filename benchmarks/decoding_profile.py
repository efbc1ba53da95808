"""Where a decoding step's time goes: TensorFlow profiler, time per kind of op.

Usage:
    python benchmarks/decoding_profile.py --run-dir runs/multi30k \
        --source ../shared/data/multi30k/val.en.gz [--label after]

Takes one batch of `--batch-size` sentences from the middle of the
length-sorted source file, decodes it with `greedy_search` and `beam_search`
(beam 4) in a `tf.function`, as the SavedModel runs them, and profiles
`--repeats` calls with `tf.profiler`. The time of every executed op is summed
by op type and by kind (matrix products, copies and layout, element-wise,
reductions and softmax, top-k and argmax, control flow); kernels run on both
cores, so summed op time can exceed the wall-clock time. Prints a table and
writes benchmarks/results/decoding_profile_LABEL.json.

Run it against another checkout's code with `PYTHONPATH=that/checkout` to
profile before and after a change on the same model.
"""

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, load_run, median, table, write_result  # noqa: E402

KINDS = {
    "matrix products": ("MatMul", "BatchMatMul", "Einsum", "Conv"),
    "copies and layout": (
        "Transpose", "Concat", "Gather", "Pack", "Slice", "Tile", "Scatter", "Select", "Fill",
        "ZerosLike", "OnesLike", "BroadcastTo", "Reverse", "Where", "Unpack", "Pad",
    ),
    "softmax and reductions": ("Softmax", "Sum", "Max", "Mean", "Min", "Any", "All", "Prod"),
    "top-k and argmax": ("TopK", "ArgMax", "ArgMin"),
    "control flow": (
        "While", "If", "Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond",
        "Identity", "_Arg", "_Retval", "PartitionedCall", "Const", "NoOp", "Shape", "Size",
        "Range", "Reshape", "ExpandDims", "Squeeze",
    ),
}  # fmt: skip


def kind_of(op_type):
    """The kind of an op type; anything unlisted is element-wise arithmetic."""
    name = op_type.lstrip("_")
    for variant in ("Mkl", "Native", "Fused"):  # oneDNN's versions of the same ops
        name = name.replace(variant, "")
    for kind, prefixes in KINDS.items():
        if any(name.startswith(prefix.lstrip("_")) for prefix in prefixes):
            return kind
    return "element-wise"


def op_times(xplane_path):
    """`({op type: seconds}, {op type: count})` from one profile's host plane."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as handle:
        space.ParseFromString(handle.read())
    seconds, counts = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                op_type = plane.event_metadata[event.metadata_id].display_name
                if op_type:  # executor bookkeeping events have none
                    seconds[op_type] += event.duration_ps * 1e-12
                    counts[op_type] += 1
    return seconds, counts


def profile(function, source, repeats, log_dir):
    """Wall-clock seconds of each call, and op times summed over the calls."""
    import tensorflow as tf

    walls = []
    tf.profiler.experimental.start(log_dir)
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = function(source)
        walls.append(time.perf_counter() - started)
    tf.profiler.experimental.stop()
    path = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))[-1]
    return walls, op_times(path), outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a training output folder")
    parser.add_argument("--source", required=True, help="sentences, one a line (.gz read too)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--label", default="after", help="names the JSON file")
    parser.add_argument(
        "--output", help="defaults to benchmarks/results/decoding_profile_LABEL.json"
    )
    args = parser.parse_args(argv)

    import numpy as np
    import sentencepiece
    import tensorflow as tf

    import keras_transformer as kt
    from pipelines.data.corpus import read_lines

    model, max_length = load_run(args.run_dir)
    sentences = sorted(read_lines(args.source), key=len)
    middle = max(0, len(sentences) // 2 - args.batch_size // 2)
    batch = sentences[middle : middle + args.batch_size]
    # Tokenized here with the sentencepiece library, as training does, so the
    # script runs against any version of the package's code.
    pieces = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(args.run_dir, "sentencepiece.model")
    ).encode(batch)
    ids = [p[: max_length - 1] + [model.eos_id] for p in pieces]
    source = np.full((len(ids), max(map(len, ids))), model.pad_id, "int32")  # (B, S)
    for row, sentence_ids in enumerate(ids):
        source[row, : len(sentence_ids)] = sentence_ids
    source = tf.constant(source)

    rows, results = [], {}
    for beam in args.beams:

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
        def decode(source_ids, beam=beam):
            if beam == 1:
                return kt.greedy_search(model, source_ids)[:, None]
            return kt.beam_search(model, source_ids, beam_size=beam, alpha=0.6)[0]

        decode(source)  # tracing, not profiled
        with tempfile.TemporaryDirectory() as log_dir:
            walls, (seconds, counts), tokens = profile(decode, source, args.repeats, log_dir)
        steps = int(np.max(np.sum(tokens.numpy() != model.pad_id, axis=-1)))
        total = sum(seconds.values())
        by_kind = collections.Counter()
        for op_type, value in seconds.items():
            by_kind[kind_of(op_type)] += value
        wall = median(walls)
        key = f"beam{beam}"
        results[key] = {
            "beam_size": beam,
            "sentences": len(batch),
            "source_width": int(source.shape[1]),
            "steps": steps,
            "median_seconds": round(wall, 4),
            "milliseconds_per_step": round(1000 * wall / steps, 2),
            "op_seconds_per_call": round(total / args.repeats, 4),
            "ops_per_call": sum(counts.values()) // args.repeats,
            "share_by_kind": {k: round(v / total, 4) for k, v in by_kind.most_common()},
            "top_ops": {
                op: {"share": round(value / total, 4), "calls": counts[op] // args.repeats}
                for op, value in seconds.most_common(15)
            },
        }
        for kind, value in by_kind.most_common():
            rows.append([beam, kind, f"{100 * value / total:.1f}%"])
        print(
            f"beam {beam}: {wall * 1000:.0f} ms a batch, {steps} steps, "
            f"{1000 * wall / steps:.1f} ms a step, {results[key]['ops_per_call']} ops a call",
            flush=True,
        )
        for op, value in seconds.most_common(12):
            print(f"    {op:28s} {100 * value / total:5.1f}%  {counts[op] // args.repeats} calls")
    write_result(
        {
            "benchmark": "decoding_profile",
            "label": args.label,
            "command": "python benchmarks/decoding_profile.py " + " ".join(argv or sys.argv[1:]),
            "code": os.path.dirname(os.path.dirname(os.path.abspath(kt.__file__))),
            "run_dir": os.path.abspath(args.run_dir),
            "results": results,
        },
        args.output or os.path.join(RESULTS, f"decoding_profile_{args.label}.json"),
    )
    print(table(["beam", "kind of op", "share of op time"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
