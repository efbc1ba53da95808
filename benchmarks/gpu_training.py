"""Training speed on a GPU (JAX backend): our Transformer vs the keras-hub composition.

Usage:
    KERAS_BACKEND=jax python benchmarks/gpu_training.py \
        [--presets transformer_base transformer_big] [--batch-size 384 --length 64] \
        [--vocabulary-size 37000] [--steps 20] [--repeats 5] [--profile]

Both models have the paper's shape (`training_throughput.hub_transformer` is
the keras-hub composition) and train under `mixed_bfloat16` with the same
step: one `jax.jit` of forward, label-smoothed loss, backward and Adam update
(`stateless_call` / `stateless_apply`, donated state). Batches are synthetic:
`--batch-size` sentences of `--length` tokens a side, each sentence's real
length drawn between half and all of `--length` (about 75% real tokens), the
paper's 25,000 tokens a side by default. Each repetition times `--steps` steps
per model, alternating which goes first; the step time is the median.

Model FLOP utilisation (MFU): training FLOPs counted on the padded shapes
(`training_throughput.model_flops` on full-length rows: projections,
feed-forward, attention, output layer; backward = 2 x forward) per second,
over a bfloat16 8192^3 matmul timed in the same run. Tokens/s counts real
source + target tokens.

`--profile` traces a few steps of our model with the JAX profiler and sums
the GPU kernels' time by kind (matrix products, attention, fusions, ...).
`--check-attention` compares the fused attention kernel (cuDNN on a GPU)
with the step-by-step path on random inputs, outputs and input gradients, in
float32 and bfloat16 (`--presets` with no name runs only this check).

Writes benchmarks/results/gpu_training.json and prints a table. Without the
JAX backend or a GPU it exits with status 2 and says why.
"""

import argparse
import glob
import gzip
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, median, table, write_result  # noqa: E402


def gpu_problem():
    """Why this benchmark cannot run here, or None."""
    import keras

    if keras.backend.backend() != "jax":
        return f"needs KERAS_BACKEND=jax (the backend is {keras.backend.backend()})"
    import jax

    if jax.devices()[0].platform != "gpu":
        return f"needs a GPU; JAX sees only {jax.devices()[0].platform} devices"
    return None


def synthetic_batch(seed, batch_size, length, vocabulary_size):
    """`(source, target_in, target_out)`, int32 `(B, L)` each, padded with 0.

    Real lengths are uniform in `[length / 2, length]`; ids avoid the reserved
    0-3 (pad, unknown, begin, end); `target_in` starts with 2 and `target_out`
    ends with 3, as the pipelines make them.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    positions = np.arange(length)[None, :]

    def sentences():
        lengths = rng.integers(length // 2, length + 1, size=(batch_size, 1))
        ids = rng.integers(4, vocabulary_size, size=(batch_size, length + 1))
        return ids, lengths

    ids, lengths = sentences()
    source = np.where(positions < lengths, ids[:, :length], 0)
    ids, lengths = sentences()
    target_in = np.where(positions < lengths, np.where(positions == 0, 2, ids[:, :length]), 0)
    target_out = np.where(positions < lengths - 1, ids[:, 1:], 0)
    target_out = np.where(positions == lengths - 1, 3, target_out)
    return tuple(array.astype("int32") for array in (source, target_in, target_out))


def build_model(name, preset, vocabulary_size):
    import numpy as np

    from benchmarks.training_throughput import hub_transformer
    from keras_transformer import Transformer
    from keras_transformer.models.presets import PRESETS

    if name == "ours":
        model = Transformer.from_preset(preset, vocabulary_size=vocabulary_size)
        model((np.ones((1, 4), "int32"), np.ones((1, 4), "int32")))
        return model
    size = {key: PRESETS[preset][key] for key in ("num_layers", "hidden_dim")}
    size.update({key: PRESETS[preset][key] for key in ("intermediate_dim", "num_heads", "dropout")})
    return hub_transformer(vocabulary_size, **size)


def make_step(model, hidden_dim):
    """`(step, state)`: a jitted Adam step on `state` and one batch, and its initial state.

    The step is the paper's: label-smoothed loss (0.1), Adam on the schedule of
    eq. (3) for `hidden_dim`.
    """
    import jax
    import keras

    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.schedules import transformer_optimizer

    loss = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    optimizer = transformer_optimizer(hidden_dim)
    optimizer.build(model.trainable_variables)

    def loss_value(trainable, non_trainable, source, target_in, target_out):
        logits, non_trainable = model.stateless_call(
            trainable, non_trainable, (source, target_in), training=True
        )
        loss_sum, tokens = loss.token_sums(target_out, logits)
        return loss_sum / tokens, non_trainable

    gradient = jax.value_and_grad(loss_value, has_aux=True)

    def step(state, source, target_in, target_out):
        trainable, non_trainable, optimizer_variables = state
        (value, non_trainable), grads = gradient(
            trainable, non_trainable, source, target_in, target_out
        )
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        return (trainable, non_trainable, optimizer_variables), value

    state = tuple(
        [keras.ops.convert_to_tensor(v.value) for v in variables]
        for variables in (
            model.trainable_variables,
            model.non_trainable_variables,
            optimizer.variables,
        )
    )
    return jax.jit(step, donate_argnums=0), state


def time_steps(step, state, batches, steps):
    """`(seconds per step, state)` over `steps` steps cycling through `batches`."""
    import jax

    jax.block_until_ready(state)
    started = time.perf_counter()
    for index in range(steps):
        state, value = step(state, *batches[index % len(batches)])
    jax.block_until_ready((state, value))
    return (time.perf_counter() - started) / steps, state


def matmul_peak(n=8192, calls=20, repeats=5):
    """bfloat16 FLOP/s of an `n`^3 matmul on random data.

    Each repetition times `calls` products back to back (one wait at the end,
    so launch gaps do not count); the median repetition is taken.
    """
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 2)
    a, b = (jax.random.normal(key, (n, n), jnp.bfloat16) for key in keys)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        products = [matmul(a, b) for _ in range(calls)]
        jax.block_until_ready(products)
        seconds.append((time.perf_counter() - started) / calls)
    return 2 * n**3 / median(seconds)


def attention_check(seed=0):
    """Fused vs step-by-step `MultiHeadAttention`: relative errors, NaNs, cuDNN used.

    Asking for the attention probabilities makes the layer attend step by step;
    without them it calls the fused kernel. Causal self-attention and
    cross-attention with padded queries and keys, 16 x 48 (40) x 512, 8 heads.
    """
    import jax
    import keras
    import numpy as np

    from keras_transformer.layers import MultiHeadAttention

    rng = np.random.default_rng(seed)
    query = rng.normal(size=(16, 48, 512)).astype("float32")
    memory = rng.normal(size=(16, 40, 512)).astype("float32")
    query_mask = np.arange(48)[None] < rng.integers(20, 49, (16, 1))
    memory_mask = np.arange(40)[None] < rng.integers(20, 41, (16, 1))
    cases = {
        "causal self-attention": {"query_mask": query_mask, "value_mask": query_mask,
                                  "use_causal_mask": True},
        "cross-attention": {"query_mask": query_mask, "value_mask": memory_mask},
    }  # fmt: skip
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        layer = MultiHeadAttention(num_heads=8, key_dim=64, dtype=policy)
        for case, kwargs in cases.items():
            outputs = {}
            for fused in (True, False):

                def attend(x, fused=fused, kwargs=kwargs, case=case, layer=layer):
                    value = x if case == "causal self-attention" else memory
                    y = layer(x, value, return_attention_scores=not fused, **kwargs)
                    y = (y if fused else y[0]).astype("float32")
                    return jax.numpy.sum(jax.numpy.where(query_mask[..., None], y, 0) ** 2), y

                (_, y), grad = jax.value_and_grad(attend, has_aux=True)(jax.numpy.asarray(query))
                compiled = jax.jit(lambda x, f=attend: f(x)[1]).lower(query).compile().as_text()
                y = np.where(query_mask[..., None], np.asarray(y, "float64"), 0.0)
                outputs[fused] = (y, np.asarray(grad, "float64"), "cudnn" in compiled.lower())

            def error(a, b):
                return float(np.linalg.norm(a - b) / np.linalg.norm(b))

            (y, grad, cudnn), (y_ref, grad_ref, _) = outputs[True], outputs[False]
            results[f"{policy}, {case}"] = {
                "output_relative_error": error(y, y_ref),
                "gradient_relative_error": error(grad, grad_ref),
                "nan": bool(np.isnan(y).any() or np.isnan(grad).any()),
                "fused_runs_cudnn": cudnn,
            }
    keras.mixed_precision.set_global_policy("float32")
    return results


def kernel_kind(name):
    lowered = name.lower()
    for kind, marks in (
        ("attention (cuDNN)", ("fmha", "flash", "cudnn")),
        ("matrix products", ("gemm", "nvjet", "cutlass", "xmma", "matmul", "dot")),
        ("random numbers", ("rng", "threefry", "philox", "random")),
        ("reductions", ("reduce",)),
        ("transposes and copies", ("transpose", "copy", "memcpy", "memset", "concatenate")),
    ):
        if any(mark in lowered for mark in marks):
            return kind
    return "element-wise fusions"


def profile_steps(step, state, batches, steps=5):
    """GPU kernel time of `steps` steps by kind and the top kernels, from a JAX trace."""
    import jax

    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            _, state = time_steps(step, state, batches, steps)
        paths = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True)
        if not paths:
            return {"error": "the profiler wrote no trace"}, state
        with gzip.open(paths[0], "rt") as handle:
            events = json.load(handle)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    gpu_pids = {
        e["pid"]
        for e in events
        if e.get("ph") == "M" and "gpu" in str(e.get("args", {}).get("name", "")).lower()
    }
    kernels = {}
    for event in events:
        if event.get("ph") == "X" and event.get("pid") in gpu_pids:
            kernels[event["name"]] = kernels.get(event["name"], 0.0) + event.get("dur", 0.0)
    total = sum(kernels.values()) or 1.0
    kinds = {}
    for name, microseconds in kernels.items():
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + microseconds
    top = sorted(kernels.items(), key=lambda item: -item[1])[:15]
    return {
        "kernel_ms_per_step": round(total / 1000 / steps, 2),
        "share_by_kind": {
            kind: round(microseconds / total, 4)
            for kind, microseconds in sorted(kinds.items(), key=lambda item: -item[1])
        },
        "top_kernels_ms_per_step": {name[:120]: round(us / 1000 / steps, 3) for name, us in top},
    }, state


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=["transformer_base", "transformer_big"])
    parser.add_argument("--models", nargs="+", default=["ours", "keras_hub"])
    parser.add_argument("--batch-size", type=int, default=384)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--vocabulary-size", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repetition")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile our model's step")
    parser.add_argument("--check-attention", action="store_true", help="fused vs reference")
    parser.add_argument("--output", default=os.path.join(RESULTS, "gpu_training.json"))
    args = parser.parse_args(argv)

    problem = gpu_problem()
    if problem:
        print(f"gpu_training: {problem}; nothing measured.", file=sys.stderr)
        return 2
    import jax
    import keras
    import numpy as np

    from benchmarks.training_throughput import model_flops
    from keras_transformer.models.presets import PRESETS

    checks = attention_check() if args.check_attention else None
    if checks:
        print(json.dumps(checks, indent=1))
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    batches = [
        synthetic_batch(seed, args.batch_size, args.length, args.vocabulary_size)
        for seed in range(4)
    ]
    batches = [tuple(jax.device_put(array) for array in batch) for batch in batches]
    real_tokens = float(np.mean([np.sum(s != 0) + np.sum(t != 0) for s, t, _ in batches]))
    full = np.ones((args.batch_size, args.length), "int32")
    peak = matmul_peak()
    results, rows = {"matmul_bf16_flops_per_second": round(peak)}, []
    for preset in args.presets:
        size = PRESETS[preset]
        flops = model_flops((full, full, full), size["num_layers"], size["hidden_dim"],
                            size["intermediate_dim"], args.vocabulary_size)  # fmt: skip
        steps, seconds = {}, {}
        for name in args.models:
            keras.utils.set_random_seed(0)
            model = build_model(name, preset, args.vocabulary_size)
            step, state = make_step(model, size["hidden_dim"])
            compile_started = time.perf_counter()
            _, state = time_steps(step, state, batches, 2)
            print(f"{preset} {name}: compiled in {time.perf_counter() - compile_started:.0f} s")
            steps[name], seconds[name] = [step, state], []
        for repeat in range(args.repeats):
            for name in args.models if repeat % 2 == 0 else args.models[::-1]:
                elapsed, steps[name][1] = time_steps(*steps[name], batches, args.steps)
                seconds[name].append(elapsed)
        entry = {"flops_per_step_padded": flops}
        for name in args.models:
            elapsed = median(seconds[name])
            entry[name] = {
                "ms_per_step": round(elapsed * 1000, 2),
                "ms_per_step_repeats": [round(s * 1000, 2) for s in seconds[name]],
                "real_tokens_per_second": round(real_tokens / elapsed),
                "tflops_per_second": round(flops / elapsed / 1e12, 1),
                "mfu": round(flops / elapsed / peak, 4),
            }
            rate = flops / elapsed
            rows.append([preset, name, f"{elapsed * 1000:.1f}", f"{real_tokens / elapsed:,.0f}",
                         f"{rate / 1e12:.0f}", f"{rate / peak:.1%}"])  # fmt: skip
        if "ours" in seconds and "keras_hub" in seconds:
            entry["speedup_over_keras_hub"] = round(
                median(seconds["keras_hub"]) / median(seconds["ours"]), 3
            )
        if args.profile and "ours" in steps:
            entry["profile_ours"], steps["ours"][1] = profile_steps(*steps["ours"], batches)
            print(json.dumps(entry["profile_ours"], indent=1))
        results[preset] = entry
        del steps
    write_result(
        {
            "benchmark": "gpu_training",
            "command": "KERAS_BACKEND=jax python benchmarks/gpu_training.py "
            + " ".join(argv or sys.argv[1:]),
            "device": str(jax.devices()[0].device_kind),
            "jax": jax.__version__,
            "keras": keras.__version__,
            "batch_size": args.batch_size,
            "length": args.length,
            "vocabulary_size": args.vocabulary_size,
            "real_tokens_per_step": real_tokens,
            "attention_check": checks,
            "results": results,
        },
        args.output,
    )
    print(table(["preset", "model", "ms/step", "real tokens/s", "TFLOP/s", "MFU"], rows))
    print(f"bf16 matmul: {peak / 1e12:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
