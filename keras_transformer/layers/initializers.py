"""Initializer copies for sublayers (private)."""

import keras


def clone_initializer(initializer):
    """A fresh instance of `initializer`, for one sublayer's weights.

    An unseeded Keras random initializer draws its seed once, when it is
    constructed, so one instance shared by several sublayers gives weights of
    the same shape the same values (the query, key and value biases, say).
    A copy made from its config draws a seed of its own; a seeded one keeps
    its seed, as Keras intends.
    """
    return keras.initializers.get(keras.initializers.serialize(initializer))
