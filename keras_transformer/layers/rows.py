"""Row-wise products on flattened tensors (private)."""

from keras import ops


def apply_to_rows(function, inputs, feature_axes=1):
    """Runs a row-wise `function` on `inputs` flattened to 2-D rows of features.

    `(B, T, *F)` inputs reach `function` as `(B * T, *F)`, where `F` are the
    last `feature_axes` axes, and its `(B * T, *G)` result comes back as
    `(B, T, *G)`. TensorFlow multiplies a 3-D tensor by a 2-D kernel as a
    batched product (BatchMatMulV2 with broadcasting), several times slower
    than one product of the same rows; the reshapes copy nothing.
    """
    shape = ops.shape(inputs)
    leading, features = shape[:-feature_axes], shape[-feature_axes:]
    outputs = function(ops.reshape(inputs, (-1, *features)))
    return ops.reshape(outputs, (*leading, *ops.shape(outputs)[1:]))
