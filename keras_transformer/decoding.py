"""Autoregressive decoding with the decoder's key/value cache."""

from keras import ops


def greedy_search(model, source_ids, max_length=None, extra_length=50):
    """Decodes by taking the most probable token at every step.

    Keys and values of earlier steps are read from the decoder's cache, so each
    step runs the decoder on one position only. Decoding stops once every
    sequence has produced `model.eos_id`, or after `max_length` tokens.

    Args:
        model: a built `Transformer`.
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        max_length: int, the most target tokens to produce. Defaults to
            `S + extra_length` (section 6.1).
        extra_length: int, see `max_length`.

    Returns:
        int32 `(B, max_length)` token ids: each row ends with `model.eos_id`
        (when produced) followed by `model.pad_id`.

    References:
        Vaswani et al., 2017, section 6.1.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    if max_length is None:
        max_length = ops.shape(source_ids)[1] + extra_length
    encoder_outputs, source_padding_mask = model.encode(source_ids)
    cross_cache = model.decoder.compute_cross_attention_cache(encoder_outputs)
    self_cache = model.decoder.initial_cache(batch_size, max_length)
    tokens = ops.concatenate(
        [
            ops.full((batch_size, 1), model.bos_id, dtype="int32"),
            ops.full((batch_size, max_length), model.pad_id, dtype="int32"),
        ],
        axis=1,
    )  # (B, 1 + max_length)
    finished = ops.zeros((batch_size,), dtype="bool")

    def condition(index, tokens, self_cache, finished):
        return ops.logical_and(index < max_length, ops.logical_not(ops.all(finished)))

    def body(index, tokens, self_cache, finished):
        step_ids = ops.slice(tokens, [0, index], [batch_size, 1])  # (B, 1)
        logits, self_cache = model.decode(
            step_ids,
            encoder_outputs,
            source_padding_mask,
            self_attention_cache=self_cache,
            cache_update_index=index,
            cross_attention_cache=cross_cache,
        )  # (B, 1, V)
        next_ids = ops.cast(ops.argmax(logits[:, 0], axis=-1), "int32")  # (B,)
        next_ids = ops.where(finished, model.pad_id, next_ids)
        finished = ops.logical_or(finished, ops.equal(next_ids, model.eos_id))
        tokens = ops.slice_update(tokens, [0, index + 1], ops.expand_dims(next_ids, 1))
        return index + 1, tokens, self_cache, finished

    _, tokens, _, _ = ops.while_loop(
        condition, body, (ops.convert_to_tensor(0, "int32"), tokens, self_cache, finished)
    )
    return tokens[:, 1:]
