"""Lists the op names a TensorFlow or tensorflow-text wheel provides, for the TF Serving check.

TF Serving 2.20 is built on TensorFlow 2.20 and embeds tensorflow-text 2.20.0;
an export loads there only if every op of its graph is registered by one of them.

    pip download tensorflow==2.20.0 tensorflow-text==2.20.0 --no-deps -d /tmp/wheels
    python tests/pipelines/serving/ops/list_serving_ops.py /tmp/wheels/tensorflow-2.20.0-*.whl \\
        > tests/pipelines/serving/ops/tensorflow_2.20.0_ops.txt
    python tests/pipelines/serving/ops/list_serving_ops.py \\
        /tmp/wheels/tensorflow_text-2.20.0-*.whl \\
        > tests/pipelines/serving/ops/tf_text_2.20.0_ops.txt

TensorFlow: the ops its generated Python wrappers (`gen_*.py`) create.
tensorflow-text: names that occur as strings in the wheel's shared libraries
(REGISTER_OP keeps op names as strings) and that importing the installed
tensorflow-text adds to TensorFlow's op registry.
"""

import re
import sys
import zipfile


def tensorflow_ops(wheel):
    ops = set()
    for name in wheel.namelist():
        if name.endswith(".py") and "/gen_" in name:
            source = wheel.read(name).decode("utf-8", "replace")
            ops |= set(re.findall(r'_apply_op_helper\(\s*"(\w+)"', source))
    return ops


def tf_text_ops(wheel):
    from tensorflow.python.framework import op_def_registry

    words = set()
    for name in wheel.namelist():
        if name.endswith(".so"):
            words |= set(re.findall(rb"[A-Z][A-Za-z0-9_]+", wheel.read(name)))
    words = {word.decode() for word in words}
    core = {word for word in words if op_def_registry.get(word) is not None}
    import tensorflow_text  # noqa: F401

    return {word for word in words - core if op_def_registry.get(word) is not None}


def main(wheel_path):
    package, version = re.search(r"(tensorflow(?:_text)?)-([0-9.]+)-", wheel_path).groups()
    with zipfile.ZipFile(wheel_path) as wheel:
        ops = tf_text_ops(wheel) if package == "tensorflow_text" else tensorflow_ops(wheel)
    print(f"# ops registered by {package.replace('_', '-')} {version}")
    for op in sorted(ops):
        print(op)


if __name__ == "__main__":
    main(sys.argv[1])
