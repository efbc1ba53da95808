"""A `MarianMTModel` state dict (safetensors or PyTorch) read and set on a `Transformer`.

Hugging Face's linear weights are `(out, in)`; ours are Keras kernels,
`(in, out)`, with the attention projections split by head: `(D, H, K)` for
the query, key and value, `(H, K, D)` for the output.
"""

import os

import numpy as np

from pipelines.errors import DataError


def weights_file(folder):
    """str: the folder's `model.safetensors`, else its `pytorch_model.bin` (which may be absent)."""
    path = os.path.join(folder, "model.safetensors")
    return path if os.path.isfile(path) else os.path.join(folder, "pytorch_model.bin")


def read_weights(folder):
    """The state dict of `model.safetensors` (or `pytorch_model.bin`, with torch), as NumPy.

    Raises:
        DataError: neither file is there or readable, or reading needs what
            is not installed.
    """
    path = weights_file(folder)
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        try:
            tensors = load_file(path)
        except Exception as error:  # safetensors raises its own error types and OSError
            raise DataError(f"{path}: not a readable safetensors file ({error})") from None
        return {name: np.asarray(value, np.float32) for name, value in tensors.items()}
    if not os.path.isfile(path):
        raise DataError(f"{folder}: no model.safetensors or pytorch_model.bin")
    try:
        import torch
    except ImportError:
        raise DataError(f"{path}: reading a PyTorch file needs torch (pip install torch)") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling and zip errors of many kinds
        raise DataError(f"{path}: not a readable PyTorch state dict ({error})") from None
    return {name: value.float().numpy() for name, value in state.items()}


class _Weights:
    """Looks tensors up by any of their tied names, checking shapes."""

    def __init__(self, tensors, folder):
        self.tensors, self.folder, self.file = tensors, folder, weights_file(folder)

    def __call__(self, names, shape):
        names = [names] if isinstance(names, str) else names
        for name in names:
            if name in self.tensors:
                value = self.tensors[name]
                if tuple(value.shape) != tuple(shape):
                    raise DataError(
                        f"{self.file}: {name} has shape {tuple(value.shape)}, "
                        f"{os.path.join(self.folder, 'config.json')}'s sizes make {tuple(shape)}"
                    )
                return value
        raise DataError(f"{self.file}: the weights have no {names[0]}")


def _set_attention(attention, prefix, weights, hidden_dim, num_heads):
    head = hidden_dim // num_heads
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        dense = getattr(attention, f"{ours}_dense")
        kernel = weights(f"{prefix}.{theirs}.weight", (hidden_dim, hidden_dim))  # (out, in)
        dense.kernel.assign(kernel.T.reshape(hidden_dim, num_heads, head))  # (D, H, K)
        dense.bias.assign(
            weights(f"{prefix}.{theirs}.bias", (hidden_dim,)).reshape(num_heads, head)
        )
    output = attention.output_dense
    kernel = weights(f"{prefix}.out_proj.weight", (hidden_dim, hidden_dim))
    output.kernel.assign(kernel.T.reshape(num_heads, head, hidden_dim))  # (H, K, D)
    output.bias.assign(weights(f"{prefix}.out_proj.bias", (hidden_dim,)))


def _set_norm(norm, prefix, weights, hidden_dim):
    norm.gamma.assign(weights(f"{prefix}.weight", (hidden_dim,)))
    norm.beta.assign(weights(f"{prefix}.bias", (hidden_dim,)))


def _set_feed_forward(feed_forward, prefix, weights, hidden_dim, intermediate_dim):
    inner, outer = feed_forward.intermediate_dense, feed_forward.output_dense
    inner.kernel.assign(weights(f"{prefix}.fc1.weight", (intermediate_dim, hidden_dim)).T)
    inner.bias.assign(weights(f"{prefix}.fc1.bias", (intermediate_dim,)))
    outer.kernel.assign(weights(f"{prefix}.fc2.weight", (hidden_dim, intermediate_dim)).T)
    outer.bias.assign(weights(f"{prefix}.fc2.bias", (hidden_dim,)))


def load_weights(model, tensors, folder):
    """Sets a built `Transformer`'s weights from a `MarianMTModel` state dict.

    Raises:
        DataError: a tensor is missing or of another shape, or the stored
            positions are not the sinusoid the model computes.
    """
    weights = _Weights(tensors, folder)
    d, f, h = model.hidden_dim, model.intermediate_dim, model.num_heads
    v, vt = model.vocabulary_size, model.target_vocabulary_size
    shared = ["model.shared.weight", "model.encoder.embed_tokens.weight"]
    model.source_embedding.embeddings.assign(weights(shared, (v, d)))
    target = ["model.decoder.embed_tokens.weight"]
    if not model.share_source_target_embeddings:
        model.target_embedding.embeddings.assign(weights(target + ["lm_head.weight"], (vt, d)))
    bias = tensors.get("final_logits_bias", np.zeros((1, vt), np.float32)).reshape(-1)
    if model.output_projection is None:
        model.logits_bias.assign(bias)
    else:
        model.output_projection.kernel.assign(weights("lm_head.weight", (vt, d)).T)
        model.output_projection.bias.assign(bias)
    for side, positions in (
        ("encoder", model.source_positions),
        ("decoder", model.target_positions),
    ):
        stored = tensors.get(f"model.{side}.embed_positions.weight")
        if stored is not None:
            computed = np.asarray(positions.encoding(stored.shape[0], d))
            # float32 sinusoids of 1,000 positions agree to about 1e-4.
            if not np.allclose(stored, computed, atol=1e-3):
                raise DataError(
                    f"{folder}: model.{side}.embed_positions is not Marian's sinusoid "
                    "(sines, then cosines): positions this import cannot map"
                )
    for index, layer in enumerate(model.encoder.stack_layers):
        prefix = f"model.encoder.layers.{index}"
        _set_attention(layer.self_attention, f"{prefix}.self_attn", weights, d, h)
        _set_norm(layer.self_attention_norm, f"{prefix}.self_attn_layer_norm", weights, d)
        _set_feed_forward(layer.feed_forward, prefix, weights, d, f)
        _set_norm(layer.feed_forward_norm, f"{prefix}.final_layer_norm", weights, d)
    for index, layer in enumerate(model.decoder.stack_layers):
        prefix = f"model.decoder.layers.{index}"
        _set_attention(layer.self_attention, f"{prefix}.self_attn", weights, d, h)
        _set_norm(layer.self_attention_norm, f"{prefix}.self_attn_layer_norm", weights, d)
        _set_attention(layer.cross_attention, f"{prefix}.encoder_attn", weights, d, h)
        _set_norm(layer.cross_attention_norm, f"{prefix}.encoder_attn_layer_norm", weights, d)
        _set_feed_forward(layer.feed_forward, prefix, weights, d, f)
        _set_norm(layer.feed_forward_norm, f"{prefix}.final_layer_norm", weights, d)
