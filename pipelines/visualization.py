"""Heat maps of the encoder-decoder attention for one sentence pair.

Rows are target subwords, columns source subwords, both labelled with their
SentencePiece pieces (`kt attention` draws them from a run).
"""

import keras
import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from keras_transformer.decoding import greedy_search  # noqa: E402
from pipelines.errors import ConfigError  # noqa: E402

CELL_INCHES = 0.32  # one token's width or height in a panel
MARGIN_INCHES = 1.6  # room for a panel's tick labels and title
DPI = 100


def attention_maps(model, processor, source, target=None, target_processor=None):
    """Encoder-decoder attention probabilities for one pair.

    Args:
        model: a trained `Transformer`.
        processor: `sentencepiece.SentencePieceProcessor` of the model.
        source: str.
        target: str or None; None decodes the model's greedy translation.
        target_processor: the target side's processor, where the model has
            one a side (None: `processor`).

    Returns:
        `(attention, source_pieces, target_pieces)`: float `(L, H, T, S)`
        probabilities, then the S source and T target piece strings (each
        ending with `</s>`).
    """
    target_processor = target_processor or processor
    eos = model.eos_id
    source_ids = processor.encode(source) + [eos]
    if target is None:
        tokens = np.asarray(greedy_search(model, np.array([source_ids], "int32")))[0]
        target_ids = [int(t) for t in tokens if t != model.pad_id]  # EOS, then padding
        if eos in target_ids:
            target_ids = target_ids[: target_ids.index(eos)]
    else:
        target_ids = target_processor.encode(target)
    target_ids = target_ids + [eos]
    encoder_outputs, mask = model.encode(np.array([source_ids], "int32"))
    decoder_inputs = np.array([[model.bos_id] + target_ids[:-1]], "int32")
    _, attention = model.decode(
        decoder_inputs, encoder_outputs, mask, return_attention_scores=True
    )  # (1, L, H, T, S)
    return (
        np.asarray(keras.ops.convert_to_numpy(attention))[0].astype("float32"),
        [processor.id_to_piece(i) for i in source_ids],
        [target_processor.id_to_piece(i) for i in target_ids],
    )


def _index(flag, value):
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{flag} takes 'all' or an integer. Received: {value!r}") from None


def select(attention, layer="all", head="all"):
    """Panels to draw: `(rows, cols, T, S)` and their titles.

    Args:
        attention: `(L, H, T, S)`.
        layer: "all" or an int layer index.
        head: "all", "mean" or an int head index.
    """
    layers = range(attention.shape[0]) if layer == "all" else [_index("--layer", layer)]
    for index in layers:
        if not 0 <= index < attention.shape[0]:
            raise ConfigError(f"--layer {index} out of range: the model has {attention.shape[0]}")
    if head == "mean":
        panels = attention[list(layers)].mean(axis=1, keepdims=True)
        titles = [[f"layer {i}, mean of heads"] for i in layers]
        return panels, titles
    heads = range(attention.shape[1]) if head == "all" else [_index("--head", head)]
    for index in heads:
        if not 0 <= index < attention.shape[1]:
            raise ConfigError(f"--head {index} out of range: the model has {attention.shape[1]}")
    panels = attention[list(layers)][:, list(heads)]
    return panels, [[f"layer {i}, head {h}" for h in heads] for i in layers]


def image_formats():
    """The file extensions `plot` can write (matplotlib's, lower case, without the dot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # the "Agg" backend used here

    return set(FigureCanvasAgg.get_supported_filetypes())


def figure_size(rows, cols, target_length, source_length):
    """Figure size in pixels `(width, height)` for a grid of panels."""
    width = cols * (source_length * CELL_INCHES + MARGIN_INCHES)
    height = rows * (target_length * CELL_INCHES + MARGIN_INCHES)
    return round(width * DPI), round(height * DPI)


def plot(panels, titles, source_pieces, target_pieces, path):
    """Writes `(rows, cols, T, S)` panels as a labelled PNG heat map."""
    rows, cols = panels.shape[:2]
    width, height = figure_size(rows, cols, len(target_pieces), len(source_pieces))
    figure, axes = plt.subplots(
        rows, cols, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False
    )
    for r in range(rows):
        for c in range(cols):
            ax = axes[r][c]
            ax.imshow(panels[r, c], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(source_pieces)), source_pieces, rotation=90, fontsize=7)
            ax.set_yticks(range(len(target_pieces)), target_pieces, fontsize=7)
            ax.set_title(titles[r][c], fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)  # fixed size: no bbox_inches="tight"
    plt.close(figure)
    return width, height
