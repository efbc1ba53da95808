"""Mask helpers shared by the attention, encoder and decoder layers (private).

Conventions (see the package docstring for the shape letters):
- a padding mask is bool `(B, S)`, True for a real token;
- an attention mask is bool `(B, T, S)`, True where a query may attend a key.
"""

from keras import ops


def causal_mask(query_length, key_length, start_index=0):
    """Bool `(T, S)` mask letting query `i` attend keys `0 .. start_index + i`.

    `start_index` is the absolute position of the first query; it is non-zero
    when a decoder attends a key/value cache one step at a time.
    """
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(start_index, "int32")
    key_positions = ops.arange(key_length, dtype="int32")
    return ops.expand_dims(query_positions, 1) >= ops.expand_dims(key_positions, 0)


def merge_attention_masks(
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    causal=None,
):
    """Combines padding, explicit and causal masks into one bool `(B, T, S)` mask.

    Args:
        query_mask: bool `(B, T)` or None.
        key_mask: bool `(B, S)` or None.
        attention_mask: bool `(B, T, S)` or None.
        causal: bool `(T, S)` or None.

    Returns:
        A bool mask broadcastable to `(B, T, S)`, or None when nothing masks.
    """
    mask = None
    if attention_mask is not None:
        mask = ops.cast(attention_mask, "bool")
    if key_mask is not None:
        key_mask = ops.expand_dims(ops.cast(key_mask, "bool"), 1)  # (B, 1, S)
        mask = key_mask if mask is None else ops.logical_and(mask, key_mask)
    if query_mask is not None:
        query_mask = ops.expand_dims(ops.cast(query_mask, "bool"), 2)  # (B, T, 1)
        mask = query_mask if mask is None else ops.logical_and(mask, query_mask)
    if causal is not None:
        causal = ops.expand_dims(causal, 0)  # (1, T, S)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    return mask


def padding_mask_to_attention_mask(padding_mask):
    """Bool `(B, S)` padding mask -> bool `(B, 1, S)` key mask for attention."""
    if padding_mask is None:
        return None
    return ops.expand_dims(ops.cast(padding_mask, "bool"), 1)
