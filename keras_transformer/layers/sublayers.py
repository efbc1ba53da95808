"""Read-only properties that expose a layer's sublayers by a public name (private)."""

import operator


def sublayer(attribute, doc):
    """A read-only property returning `self.<attribute>`, documented by `doc`.

    Layers keep their sublayers under private attributes (set in `build`)
    and expose them this way, as `keras.layers.MultiHeadAttention` exposes
    `query_dense`: converters, cache builders and benchmarks read the public
    name, and nothing can rebind it.
    """
    return property(operator.attrgetter(attribute), doc=doc)
