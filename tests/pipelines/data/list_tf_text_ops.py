"""Writes the op names a tensorflow-text wheel registers, for the TF Serving check.

    pip download tensorflow-text==2.20.0 --no-deps -d /tmp/wheel
    python tests/pipelines/data/list_tf_text_ops.py /tmp/wheel/tensorflow_text-2.20.0-*.whl \
        > tests/pipelines/data/tf_text_2.20.0_ops.txt

A name is listed when it occurs as a string in a shared library of the given
wheel (REGISTER_OP keeps op names as strings) and is an op that importing the
installed tensorflow-text adds to TensorFlow's registry.
"""

import re
import sys
import zipfile

import tensorflow as tf
from tensorflow.python.framework import op_def_registry


def main(wheel_path):
    words = set()
    with zipfile.ZipFile(wheel_path) as wheel:
        for name in wheel.namelist():
            if name.endswith(".so"):
                words |= set(re.findall(rb"[A-Z][A-Za-z0-9_]+", wheel.read(name)))
    words = {word.decode() for word in words}
    core = {word for word in words if op_def_registry.get(word) is not None}
    import tensorflow_text  # noqa: F401

    added = {word for word in words - core if op_def_registry.get(word) is not None}
    version = re.search(r"tensorflow_text-([0-9.]+)-", wheel_path).group(1)
    print(
        f"# ops registered by tensorflow-text {version} (TensorFlow {tf.__version__} used to list)"
    )
    for op in sorted(added):
        print(op)


if __name__ == "__main__":
    main(sys.argv[1])
