"""Training on the JAX backend, data-parallel over two virtual CPU devices.

`make test` runs this folder on its own, with `KERAS_BACKEND=jax` and
`XLA_FLAGS=--xla_force_host_platform_device_count=2` (set before JAX starts);
under another backend it is not collected.
"""

import keras

if keras.backend.backend() != "jax":
    collect_ignore_glob = ["test_*.py"]
