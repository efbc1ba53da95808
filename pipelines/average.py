"""Checkpoint averaging (section 6.1: the last 5 or 20 checkpoints).

Usage:
    python -m pipelines.average runs/multi30k/checkpoints/*.keras --output averaged.keras
"""

import argparse
import sys

import keras
import numpy as np

import keras_transformer  # noqa: F401  registers the classes that .keras files name
from pipelines.corpus import DataError


def average_checkpoints(paths, output_path):
    """Writes a model whose weights are the element-wise mean of the checkpoints'.

    Args:
        paths: list of str, `.keras` files of one architecture.
        output_path: str, the `.keras` file to write.

    Returns:
        the averaged `keras.Model` (not compiled).
    """
    if not paths:
        raise DataError("No checkpoints to average")
    models = []
    for path in paths:
        try:
            models.append(keras.saving.load_model(path, compile=False))
        except (OSError, ValueError) as error:
            raise DataError(f"Cannot load checkpoint {path}: {error}") from None
    shapes = [[w.shape for w in m.get_weights()] for m in models]
    for path, model_shapes in zip(paths, shapes, strict=True):
        if model_shapes != shapes[0]:
            raise DataError(f"{path} does not have the architecture of {paths[0]}")
    # Accumulate in float64 so averaging many checkpoints adds no rounding.
    mean = [
        np.mean([np.asarray(m.get_weights()[i], np.float64) for m in models], axis=0)
        for i in range(len(shapes[0]))
    ]
    averaged = models[0]
    averaged.set_weights(
        [m.astype(w.dtype) for m, w in zip(mean, averaged.get_weights(), strict=True)]
    )
    averaged.save(output_path)
    return averaged


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help=".keras checkpoints of one run")
    parser.add_argument("--output", required=True, help="the averaged .keras model to write")
    args = parser.parse_args(argv)
    try:
        average_checkpoints(args.checkpoints, args.output)
    except DataError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"Averaged {len(args.checkpoints)} checkpoints into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
