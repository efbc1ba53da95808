"""Converts a trained Transformer to a CTranslate2 model folder, and translates with it.

CTranslate2 is a C++ inference engine for Transformer translation models. It
is an optional extra (`pip install "keras-aiayn[tensorflow,ctranslate2]"`); this
module imports it only when called.

    kt ct2-export --run-dir runs/multi30k --output ct2/multi30k

The folder holds `model.bin`, `config.json`, the vocabulary and a copy
of `sentencepiece.model` (and `sentencepiece.target.model` for a model with
one a side). `CTranslate2Translator` wraps it with the same
tokenization as the SavedModel export: SentencePiece pieces, EOS appended to
the source, sources longer than `max_source_length - 1` pieces truncated.

CTranslate2 ranks finished hypotheses by `log p / length**length_penalty`,
the `penalty_form="power"` of our searches (an imported model's), not GNMT's
`((5 + length) / 6)**alpha`: with a run's default form only no length penalty
(`alpha=0` here, `length_penalty=0` there) makes the two maximise the same
score. CTranslate2 has no forced end at the length limit (`end_at_limit`):
a hypothesis cut by the limit ends without it.

No converter ships with CTranslate2 for Keras models, hence this one: it maps
each weight of `keras_transformer.Transformer` onto `TransformerSpec`.
"""

import json
import os
import shutil

import numpy as np

from pipelines.data.language_codes import has_language_codes, split_language_code
from pipelines.data.tokenizer import check_special_ids
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import ExportError
from pipelines.files import staging_folder
from pipelines.serving.translation import EXTRA_LENGTH

_ACTIVATIONS = {"relu": 0, "gelu": 3, "silu": 2, "swish": 2}  # ctranslate2 Activation


def _numpy(variable):
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable, np.float32)


def _set_linear(spec, dense):
    """A Keras (in, out) kernel becomes CTranslate2's (out, in) weight."""
    kernel = _numpy(dense.kernel)
    spec.weight = np.ascontiguousarray(kernel.reshape(kernel.shape[0], -1).T)
    if dense.bias is not None:
        spec.bias = _numpy(dense.bias).reshape(-1)


def _projection_weights(attention, name):
    """`(H*K, D)` weight and `(H*K,)` bias of the query, key or value projection."""
    dense = getattr(attention, f"{name}_dense")
    kernel = _numpy(dense.kernel)  # (D, H, K)
    bias = None if dense.bias is None else _numpy(dense.bias).reshape(-1)
    return kernel.reshape(kernel.shape[0], -1).T, bias


def _set_fused(spec, attention, names):
    weights = [_projection_weights(attention, name) for name in names]
    spec.weight = np.ascontiguousarray(np.concatenate([w for w, _ in weights], axis=0))
    if weights[0][1] is not None:
        spec.bias = np.concatenate([b for _, b in weights], axis=0)


def _set_attention(spec, attention, norm, self_attention):
    if self_attention:
        _set_fused(spec.linear[0], attention, ("query", "key", "value"))
    else:
        _set_fused(spec.linear[0], attention, ("query",))
        _set_fused(spec.linear[1], attention, ("key", "value"))
    output = attention.output_dense  # kernel (H, K, D)
    kernel = _numpy(output.kernel)
    spec.linear[-1].weight = np.ascontiguousarray(kernel.reshape(-1, kernel.shape[-1]).T)
    if output.bias is not None:
        spec.linear[-1].bias = _numpy(output.bias)
    _set_norm(spec.layer_norm, norm)


def _set_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_feed_forward(spec, layer):
    _set_linear(spec.linear_0, layer.feed_forward.intermediate_dense)
    _set_linear(spec.linear_1, layer.feed_forward.output_dense)
    _set_norm(spec.layer_norm, layer.feed_forward_norm)


def _positions(model, encoding_layer, num_positions):
    if model.learned_positions:
        return _numpy(encoding_layer.position_embeddings)
    return _numpy(encoding_layer.encoding(num_positions, model.hidden_dim))


def model_spec(model, pieces, num_positions=1024, target_pieces=None):
    """Describes a built `Transformer` as a `ctranslate2.specs.TransformerSpec`.

    A model that starts decoding with its padding token (an imported Marian
    model's, whose padding embedding is zero) is written as CTranslate2's own
    Marian converter writes it: the padding token is left out of the
    vocabularies and weights (so it is never generated; CTranslate2 takes
    pieces, so the ids after it may shift), and the decoder starts from a
    zero embedding.

    Args:
        model: a built `keras_transformer.Transformer`.
        pieces: list of str, the (source) vocabulary in id order.
        num_positions: int, sinusoidal positions written into the model (the
            longest source or translation it can handle).
        target_pieces: list of str, the target vocabulary where it is another
            (None: `pieces`).

    Returns:
        the spec, weights set and vocabularies registered.
    """
    from ctranslate2 import specs

    target_pieces = pieces if target_pieces is None else target_pieces
    for name, found, size in (
        ("source", pieces, model.vocabulary_size),
        ("target", target_pieces, model.target_vocabulary_size),
    ):
        if len(found) != size:
            raise ExportError(
                f"the {name} SentencePiece model has {len(found)} pieces but the model's "
                f"{name} vocabulary has {size}"
            )
    starts_with_pad = model.bos_id == model.pad_id
    start_row = _numpy(model.target_embedding.embeddings)[model.bos_id]
    if starts_with_pad and np.abs(start_row).max() > 0:
        raise ExportError(
            "the model starts decoding with its padding token, whose embedding row is not zero "
            "(a fine-tuned imported model's): CTranslate2 would start it from a zero "
            "embedding; serve its SavedModel (kt export) instead"
        )
    activation = model.activation.__name__
    if activation not in _ACTIVATIONS:
        raise ExportError(f"CTranslate2 has no activation {activation!r}")
    spec = specs.TransformerSpec.from_config(
        model.num_layers,
        model.num_heads,
        pre_norm=model.normalize_first,
        activation=specs.Activation(_ACTIVATIONS[activation]),
    )
    spec.config.layer_norm_epsilon = model.layer_norm_epsilon
    spec.config.add_source_eos = True
    spec.config.eos_token = target_pieces[model.eos_id]
    spec.config.decoder_start_token = target_pieces[model.bos_id]
    encoder, decoder = spec.encoder, spec.decoder
    embeddings = _numpy(model.source_embedding.embeddings)
    encoder.embeddings[0].weight = embeddings
    decoder.embeddings.weight = _numpy(model.target_embedding.embeddings)
    encoder.scale_embeddings = decoder.scale_embeddings = model.source_embedding.scale
    encoder.position_encodings.encodings = _positions(model, model.source_positions, num_positions)
    decoder.position_encodings.encodings = _positions(model, model.target_positions, num_positions)
    if model.output_projection is None:
        decoder.projection.weight = decoder.embeddings.weight
        if model.logits_bias is not None:
            decoder.projection.bias = _numpy(model.logits_bias)
    else:
        _set_linear(decoder.projection, model.output_projection)
    for layer_spec, layer in zip(encoder.layer, model.encoder.stack_layers, strict=True):
        _set_attention(
            layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, True
        )
        _set_feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder.stack_layers, strict=True):
        _set_attention(
            layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, True
        )
        _set_attention(
            layer_spec.attention, layer.cross_attention, layer.cross_attention_norm, False
        )
        _set_feed_forward(layer_spec.ffn, layer)
    for stack, stack_spec in ((model.encoder, encoder), (model.decoder, decoder)):
        if stack.final_norm is not None:
            _set_norm(stack_spec.layer_norm, stack.final_norm)
    if starts_with_pad:
        _drop_padding_token(spec, model.pad_id)
        decoder.start_from_zero_embedding = True
        spec.config.decoder_start_token = spec.config.eos_token  # any: the embedding is zero
        pieces, target_pieces = (
            [*side[: model.pad_id], *side[model.pad_id + 1 :]] for side in (pieces, target_pieces)
        )
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(target_pieces)
    return spec


def _drop_padding_token(spec, pad_id):
    """Removes row `pad_id` (the padding token's) of the embeddings, projection and its bias."""
    for item in (spec.encoder.embeddings[0], spec.decoder.embeddings, spec.decoder.projection):
        item.weight = np.delete(item.weight, pad_id, axis=0)
        bias = getattr(item, "bias", None)
        if isinstance(bias, np.ndarray):
            item.bias = np.delete(bias, pad_id)


def convert(
    model,
    spm_path,
    output_dir,
    max_source_length=128,
    quantization=None,
    force=False,
    extra_length=EXTRA_LENGTH,
    search=None,
):
    """Writes a CTranslate2 model folder for `model`.

    Args:
        model: a built `keras_transformer.Transformer`.
        spm_path: str, its SentencePiece model (copied into the folder).
        output_dir: str, the folder to write.
        max_source_length: int, the most source pieces kept (EOS included), as in training.
        quantization: str or None, e.g. "int8" (CTranslate2's weight types).
        force: bool, replace an existing folder.
        extra_length: int, target pieces beyond the source pieces (the run's
            `decoding.extra_length`, as the SavedModel takes it).
        search: dict or None, the run's `decoding` settings, recorded in the
            folder for `CTranslate2Translator`'s defaults (`beam_size`,
            `alpha`, `max_output_length`, `end_at_limit`).

    Returns:
        `output_dir`.
    """
    import sentencepiece

    if os.path.exists(output_dir) and not force:
        raise ExportError(f"{output_dir} exists; pass force=True (--force) to replace it")
    check_special_ids(model, spm_path)
    target_path = target_vocabulary_path(spm_path)
    pieces, target_pieces = (_pieces(sentencepiece, path) for path in (spm_path, target_path))
    search = {"beam_size": 4, "alpha": 0.6, "max_output_length": 0, "end_at_limit": False,
              **(search or {})}  # fmt: skip
    positions = max_source_length + extra_length + 1
    if search["max_output_length"]:  # every sentence's limit, whatever its source
        positions = max(max_source_length, search["max_output_length"]) + 1
    spec = model_spec(model, pieces, positions, target_pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    parent = os.path.dirname(os.path.abspath(output_dir))
    staging = staging_folder(parent)
    spec.save(staging)
    shutil.copy(spm_path, os.path.join(staging, "sentencepiece.model"))
    if target_path != spm_path:
        shutil.copy(target_path, os.path.join(staging, "sentencepiece.target.model"))
    with open(os.path.join(staging, "keras_transformer.json"), "w", encoding="utf-8") as handle:
        recorded = {"max_source_length": max_source_length, "extra_length": extra_length}
        names = ("beam_size", "alpha", "max_output_length", "end_at_limit")
        recorded.update({name: search[name] for name in names})
        json.dump(recorded, handle)
    # The folder is replaced whole: the old one is moved aside, then removed.
    old = f"{staging}-old"
    if os.path.exists(output_dir):
        os.rename(output_dir, old)
    os.rename(staging, output_dir)
    shutil.rmtree(old, ignore_errors=True)
    return output_dir


def _pieces(sentencepiece, path):
    processor = sentencepiece.SentencePieceProcessor(model_file=path)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def _encode(processor, sentences, language_codes):
    """Each sentence's SentencePiece pieces; with `language_codes`, a leading code kept whole."""
    if not language_codes:
        return processor.encode(sentences, out_type=str)
    split = [split_language_code(sentence) for sentence in sentences]
    rests = processor.encode([rest for _, rest in split], out_type=str)
    return [code + rest for (code, _), rest in zip(split, rests, strict=True)]


class CTranslate2Translator:
    """Translates sentences with a folder written by `convert`.

    Args:
        path: str, the folder.
        threads: int, CPU threads for one translation batch.
        compute_type: str, CTranslate2's compute type ("default" keeps the
            saved weight type).
        inter_threads: int, batches translated at once (each with `threads`
            threads).
    """

    def __init__(self, path, threads=2, compute_type="default", inter_threads=1):
        import ctranslate2
        import sentencepiece

        self.translator = ctranslate2.Translator(
            path,
            device="cpu",
            inter_threads=inter_threads,
            intra_threads=threads,
            compute_type=compute_type,
        )
        vocabulary = os.path.join(path, "sentencepiece.model")
        self.processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary)
        target = target_vocabulary_path(vocabulary)
        self.target_processor = sentencepiece.SentencePieceProcessor(model_file=target)
        self.language_codes = has_language_codes(vocabulary)
        self.target_language_codes = (
            self.language_codes if target == vocabulary else has_language_codes(target)
        )
        with open(os.path.join(path, "keras_transformer.json"), encoding="utf-8") as handle:
            options = json.load(handle)
            # Folders written by 0.1.0 name it max_length.
            self.max_source_length = options.get("max_source_length", options.get("max_length"))
            self.extra_length = options.get("extra_length", EXTRA_LENGTH)
            self.max_output_length = options.get("max_output_length") or None
            # No forced end here: a hypothesis stops one piece earlier, without its end.
            self.forced_end = int(bool(options.get("end_at_limit")))
            self.search = {"beam_size": options.get("beam_size", 4)}
            self.search["length_penalty"] = options.get("alpha", 0.6)

    def source_pieces(self, sentences):
        """Source pieces, a leading language code kept whole where the vocabulary has codes.

        Args:
            sentences: list of str.

        Returns:
            list of lists of str, the pieces `translate` sends (before truncation).
        """
        return _encode(self.processor, sentences, self.language_codes)

    def target_pieces(self, prefixes):
        """Target pieces of `prefixes` (list of str), a leading language code kept whole
        where the target vocabulary has codes, as the SavedModel's target tokenizer keeps it.

        Args:
            prefixes: list of str, one target prefix per sentence.

        Returns:
            list of lists of str, CTranslate2's `target_prefix`.
        """
        return _encode(self.target_processor, prefixes, self.target_language_codes)

    def translate(
        self, sentences, beam_size=None, length_penalty=None, batch_size=64, controls=None,
        prefixes=None,
    ):  # fmt: skip
        """Translates `sentences` (list of str) in order.

        Args:
            sentences: list of str.
            beam_size: int, 1 for greedy search; None for the run's.
            length_penalty: float, CTranslate2's `score / length**length_penalty`;
                None for the run's `alpha`.
            batch_size: int, sentences per call (CTranslate2 sorts by length itself).
            controls: `keras_transformer.DecodingControls` (or a dict of its
                fields) of Python values, or None: passed to `translate_batch`
                as its `no_repeat_ngram_size`, `repetition_penalty`,
                `min_decoding_length`, `max_decoding_length`, `disable_unk`
                and `suppress_sequences` (the banned ids as target pieces).
            prefixes: list of str or None, each translation's start ("" for
                none), CTranslate2's `target_prefix`.

        Returns:
            `(translations, scores, token_counts)`: lists of str, float, int.
        """
        pieces = [p[: self.max_source_length - 1] for p in self.source_pieces(sentences)]
        longest = max((len(p) for p in pieces), default=0)
        # The SavedModel's limit: the source length (EOS included) + extra_length, or the
        # run's max_output_length. (CTranslate2 has one limit for a batch.)
        limit = (self.max_output_length or longest + 1 + self.extra_length) - self.forced_end
        options = {"max_decoding_length": max(limit, 1), "min_decoding_length": 0}
        if controls is not None:
            controlled = self._control_options(controls)
            # Within the sentence's own limit, one piece less before a forced end (as the export).
            limit = min(controlled.pop("max_decoding_length", limit) - self.forced_end, limit)
            options.update(controlled, max_decoding_length=max(limit, 1))
        if prefixes is not None:
            options["target_prefix"] = self.target_pieces(prefixes)
        results = self.translator.translate_batch(
            pieces,
            max_batch_size=batch_size,
            beam_size=self.search["beam_size"] if beam_size is None else beam_size,
            length_penalty=self.search["length_penalty"]
            if length_penalty is None
            else length_penalty,
            return_scores=True,
            **options,
        )
        tokens = [r.hypotheses[0] for r in results]
        translations = [self.target_processor.decode_pieces(t) for t in tokens]
        return translations, [r.scores[0] for r in results], [len(t) for t in tokens]

    def _control_options(self, controls):
        """`translate_batch`'s keyword arguments for `DecodingControls` of Python values."""
        from keras_transformer.decoding.controls import ANY_TOKEN, DecodingControls

        controls = DecodingControls.coerce(controls)
        options = {
            "no_repeat_ngram_size": controls.no_repeat_ngram_size,
            "repetition_penalty": controls.repetition_penalty,
            "min_decoding_length": controls.min_length,
            "disable_unk": controls.disable_unk,
        }
        if controls.max_length:
            options["max_decoding_length"] = controls.max_length
        if controls.banned_tokens is not None:
            options["suppress_sequences"] = [
                [self.target_processor.id_to_piece(int(i)) for i in row if i != ANY_TOKEN]
                for row in np.asarray(controls.banned_tokens)
            ]
        return options
