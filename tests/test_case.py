"""Shared checks every layer test runs (config, calls, a jit fit step, dtypes, saving)."""

import os
import pathlib
import signal
import subprocess
import tempfile
import time

import keras
import numpy as np
from keras import ops

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")


def package_modules(package):
    """Dotted names of a top-level package's modules, `__init__.py` files left out."""
    root = pathlib.Path(__file__).resolve().parents[1]
    return sorted(
        ".".join(path.relative_to(root).with_suffix("").parts)
        for path in (root / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def modules_with_examples(package):
    """`(module_name, example_count)` for each module whose source holds `>>>` examples.

    The count is read from the source text, so a doctest run that finds fewer
    examples than the file holds (a docstring doctest does not collect) fails.
    """
    root = pathlib.Path(__file__).resolve().parents[1]
    found = []
    for name in package_modules(package):
        source = (root / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        count = sum(line.lstrip().startswith(">>> ") for line in source.splitlines())
        if count:
            found.append((name, count))
    return found


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def token_batch(seed, batch_size=8, source_length=7, target_length=6):
    """A training batch of random ids with unequal padding, as NumPy int32 arrays.

    Rows hold different numbers of real tokens, so devices and micro-batches
    that split it hold unequal token counts: a loss that averages per part
    instead of over the whole batch gives another step.

    Returns:
        `((source_ids (B, S), target_input_ids (B, T)), target_output_ids (B, T))`.
    """
    rng = np.random.default_rng(seed)
    source = rng.integers(4, 30, (batch_size, source_length)).astype(np.int32)
    target = rng.integers(4, 30, (batch_size, target_length + 1)).astype(np.int32)
    for row in range(batch_size):
        source[row, source_length - row % 4 :] = 0
        target[row, target_length + 1 - row % 5 :] = 0
    return (source, target[:, :-1]), target[:, 1:]


def split_batch(batch, parts):
    """`token_batch`'s batch cut by rows into `parts` equal micro-batches."""
    (source, target_input), target_output = batch
    size = source.shape[0] // parts
    cut = lambda x, i: x[i * size : (i + 1) * size]  # noqa: E731
    return [((cut(source, i), cut(target_input, i)), cut(target_output, i)) for i in range(parts)]


def backed_up_step(backup_dir):
    """The step of the newest complete backup in a run's `backup/` folder (0: none)."""
    steps = [int(path.parent.name[len("step-") :]) for path in backup_dir.glob("step-*/state.json")]
    return max(steps, default=0)


def killed_and_resumed(command, cwd, env, backup_dir, result_file, timeout=600, after_step=1):
    """Runs `command`, kills it (SIGKILL) once it backed up `after_step`, then runs it again.

    Args:
        command: list of str, a training command that writes backups in `backup_dir`.
        cwd, env: where and with what environment both runs start.
        backup_dir: pathlib.Path, the run's `backup/` folder; the first run is
            killed a second after a backup of `after_step` or later appears.
        result_file: pathlib.Path, what only a finished run writes: absent after the kill.
        timeout: float, seconds the second run may take.
        after_step: int, the step the first run backs up before the kill.

    Returns:
        the second run's `subprocess.CompletedProcess` (text output captured).
    """
    first = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while (
        backed_up_step(backup_dir) < after_step and first.poll() is None and time.time() < deadline
    ):
        time.sleep(0.2)
    time.sleep(1.0)
    assert first.poll() is None, "the run ended before it could be killed"
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not result_file.exists()
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_together(command, cwd, environments, timeout=600):
    """Runs `command` once per environment, all at once (the workers or processes of one run).

    A process that has not finished after `timeout` seconds (the others wait in a collective
    when one stopped early) fails the test, and all are killed.

    Returns:
        list of str, each process's output (stdout and stderr), once all exited with status 0.
    """
    import pytest

    processes = [
        subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for env in environments
    ]
    try:
        logs = [process.communicate(timeout=timeout)[0] for process in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        logs = [process.communicate()[0] for process in processes]
        pytest.fail(f"the processes did not finish in {timeout} s:\n" + "\n".join(logs)[-6000:])
    codes = [process.returncode for process in processes]
    assert codes == [0] * len(processes), "\n".join(log[-3000:] for log in logs)
    return logs


def random_transformer(sources, vocabulary_size, num_layers, seed):
    """A small `Transformer` with NumPy-drawn weights, the same under every backend.

    Args:
        sources: int `(B, S)` ids it is built on.
        vocabulary_size: int.
        num_layers: int.
        seed: int, the weights' seed (normal, scale 0.3; LayerNorms left at 1 and 0).
    """
    from keras_transformer import Transformer

    model = Transformer(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=2,
        dropout=0.0,
    )
    model((sources, sources))
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if not weight.path.endswith(("gamma", "beta")):
            weight.assign(rng.normal(0.0, 0.3, weight.shape).astype("float32"))
    return model


def gradient(function, x):
    """The gradient of a scalar `function` at the float array `x`, as NumPy, on any backend."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(function)(jax.numpy.asarray(x)))
    if backend == "tensorflow":
        import tensorflow as tf

        variable = tf.Variable(x)
        with tf.GradientTape() as tape:
            value = function(variable)
        return tape.gradient(value, variable).numpy()
    if backend == "torch":
        import torch

        tensor = torch.tensor(x, requires_grad=True)
        function(tensor).backward()
        return tensor.grad.numpy()
    raise NotImplementedError(f"no gradient helper for the {backend} backend")


def _symbolic_inputs(input_data):
    return {
        name: keras.Input(
            shape=value.shape[1:], batch_size=value.shape[0], dtype=str(value.dtype), name=name
        )
        for name, value in input_data.items()
    }


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def check_config_round_trip(layer):
    """get_config/from_config and serialize/deserialize give the same config."""
    config = layer.get_config()
    restored = layer.__class__.from_config(config)
    assert restored.get_config() == config
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(revived, layer.__class__)
    assert revived.get_config() == config


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    call_kwargs=None,
    run_training_check=True,
    run_precision_checks=True,
):
    """Runs the checks every public layer must pass.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        input_data: dict of call-argument name -> NumPy array (tensor inputs).
        expected_output_shape: the shape of the (first) output.
        expected_num_trainable_weights: int.
        call_kwargs: dict of non-tensor call arguments.
        run_training_check: run one jit-compiled fit step.

    The layer is also saved inside a functional model to a `.keras` file and
    reloaded with `safe_mode=True`; the outputs must be identical.
        run_precision_checks: repeat the calls under mixed precision.
    """
    call_kwargs = call_kwargs or {}
    layer = layer_cls(**init_kwargs)
    check_config_round_trip(layer)

    # Eager call builds the layer.
    eager_output = _first(layer(**input_data, **call_kwargs))
    assert tuple(eager_output.shape) == tuple(expected_output_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    check_config_round_trip(layer)

    # Symbolic call in a functional model.
    symbolic_layer = layer_cls(**init_kwargs)
    symbolic_inputs = _symbolic_inputs(input_data)
    symbolic_output = _first(symbolic_layer(**symbolic_inputs, **call_kwargs))
    assert tuple(symbolic_output.shape) == tuple(expected_output_shape)
    model = keras.Model(symbolic_inputs, symbolic_output)
    np.testing.assert_allclose(
        to_numpy(model(input_data)),
        to_numpy(_first(symbolic_layer(**input_data, **call_kwargs))),
        rtol=1e-5,
        atol=1e-5,
    )

    with tempfile.TemporaryDirectory() as folder:
        run_model_saving_test(model, input_data, folder)

    if run_training_check:
        _run_jit_fit_step(model, input_data, expected_output_shape)

    if run_precision_checks:
        for policy_name in MIXED_POLICIES:
            _run_precision_check(layer_cls, init_kwargs, input_data, call_kwargs, policy_name)


def _run_jit_fit_step(model, input_data, output_shape):
    """One jit-compiled fit step changes the trainable weights."""
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse", jit_compile=True)
    targets = np.random.default_rng(0).normal(size=output_shape).astype("float32")
    history = model.fit(input_data, targets, batch_size=output_shape[0], epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [to_numpy(w) for w in model.trainable_weights]
    assert any(not np.allclose(b, a) for b, a in zip(before, after, strict=True)), (
        "fit step changed nothing"
    )


def _run_precision_check(layer_cls, init_kwargs, input_data, call_kwargs, policy_name):
    """Under a mixed policy: float32 weights, outputs in the compute dtype."""
    policy = keras.DTypePolicy(policy_name)
    layer = layer_cls(**{**init_kwargs, "dtype": policy})
    output = _first(layer(**input_data, **call_kwargs))
    assert keras.backend.standardize_dtype(output.dtype) == policy.compute_dtype
    for weight in layer.weights:
        assert keras.backend.standardize_dtype(weight.dtype) == "float32", weight.path
    for sublayer in layer._flatten_layers():
        assert sublayer.dtype_policy.name == policy_name, sublayer.name


def run_model_saving_test(model, input_data, tmp_path):
    """`.keras` save and reload with safe_mode=True gives identical outputs.

    Args:
        model: a built Keras model or layer wrapped in a model.
        input_data: what the model is called on.
        tmp_path: a pathlib folder to write in.
    """
    expected = to_numpy(_first(model(input_data)))
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert restored.__class__ is model.__class__
    np.testing.assert_array_equal(to_numpy(_first(restored(input_data))), expected)
    return restored
