"""SavedModel export for TF Serving: raw sentences in, translations out.

`export(Translator(model, ...), "saved_models/default")` writes
`saved_models/default/1/` (TF Serving's `NAME/VERSION` layout; the command is
`kt export`). The SavedModel
holds the SentencePiece model as an asset (`assets/sentencepiece.model`, and
`assets/sentencepiece.target.model` for a model with one a side) and
does everything in its graph: UTF-8 cleanup, tokenization, truncation, beam
search with the key/value cache over length-sorted chunks of the request,
detokenization. It needs only tensorflow and tensorflow-text to load.
`export` also writes the search settings to `assets.extra/keras_transformer.json`
(`client.export_settings` reads them).

Signatures (`inputs` is always a string tensor of shape `[None]`):
    serving_default: `translations` string `[None]`, `scores` float32 `[None]`,
        beam search with the export's beam size and length penalty.
    nbest: `translations` string `[None, N]`, `scores` float32 `[None, N]`,
        the N best hypotheses per sentence, best first.
    translate: also takes `beam_size` (int32 scalar), `alpha` (float32
        scalar) and `penalty_form` (string scalar: "gnmt", "power", or ""
        for the export's); beam size 1 is greedy search.
    score: `sources`, `targets` string `[None]` -> `scores` float32 `[None]`
        (log-probabilities, no length penalty), `lengths` int32 `[None]`.
    prefix: also takes `prefixes` string `[None]`: each translation starts
        with its prefix ("" for none); outputs as `serving_default`'s.
    align: `prefix`'s inputs and outputs, and `alignments` int32 `[None, T]`
        (for each target piece, the source piece it attends to most; -1 for
        none), `target_pieces` string `[None, T]`, `source_pieces` string
        `[None, S]` (SentencePiece pieces, "" past each sentence's end).
    sample: also takes `temperature`, `top_k`, `top_p` and `seed`, one a
        sentence (`[None]`): one sample each, `translations` and `scores`.
    controlled: also takes the decoding controls, one a sentence (`[None]`):
        `no_repeat_ngram_size` int32, `repetition_penalty` float32,
        `min_length` int32, `max_length` int32 (0: none of its own),
        `disable_unk` bool, `banned_words` string (words and phrases, one a
        line); the export's search; outputs as `serving_default`'s
        (`pipelines.serving.controls`).
    controlled_search: `controlled`'s inputs, `prefixes`, and `translate`'s
        scalars `beam_size`, `alpha` and `penalty_form`: any search a request
        asks for, with each sentence's prefix and controls (neutral values
        and "" turn them off); outputs as `serving_default`'s.
    controlled_sample: `controlled`'s inputs, `prefixes`, and `sample`'s
        four: one sample each, with each sentence's prefix and controls.

`Translator(..., signatures=[...])` (`kt export --signatures`) exports some of
them only.

Prefixes and alignments are signatures of their own, not optional inputs or
outputs of `serving_default`: a signature's inputs are all required, TF
Serving computes every output of a signature (its REST API cannot filter
them), and clients of `serving_default` keep their contract. Every signature
but `translate` and `controlled_search` takes batch-major inputs only, so TF
Serving's request batcher can merge its requests (their scalars cannot be
merged).

An empty (or all-space) sentence translates to an empty string with score 0.
A sentence longer than `max_source_length` tokens (end-of-sequence included)
is truncated to that length and translated. Bytes that are not valid UTF-8 are
replaced by U+FFFD before tokenization.
"""

import errno
import functools
import os
import shutil

import tensorflow as tf
import tensorflow_text as tf_text

from pipelines.data.language_codes import LanguageCodes, has_language_codes
from pipelines.data.tokenizer import Sides, check_special_ids
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import ExportError
from pipelines.files import free_bytes, staging_folder, write_json
from pipelines.serving.client import SETTINGS_FILE, SIGNATURE_INPUT
from pipelines.serving.quantization import quantized
from pipelines.serving.rows import check_rows
from pipelines.serving.signatures import (
    SIGNATURES,
    chosen_signatures,
    combined_signatures,
    form_offset,
    guided_signatures,
)
from pipelines.serving.translation import (
    CHUNK_SIZE,
    EXTRA_LENGTH,
    LENGTH_DEFAULTS,
    score_strings,
    translate_strings,
)
from pipelines.serving.versions import check_version, next_version
from pipelines.serving.warmup import write_warmup_requests
from pipelines.training.checkpoints import with_dtype_policy


class Translator(tf.Module):
    """A Keras `Transformer` and its tokenizer, wrapped for `tf.saved_model.save`.

    It needs the TensorFlow backend (`KERAS_BACKEND=tensorflow`): the export is
    a TensorFlow graph of the model's own weights.

    The translation signatures run `pipelines.serving.translation.translate_strings`
    and `score` runs `score_strings`: a request is sorted by length and handled
    `chunk_size` sentences at a time, so its memory does not grow with its
    size. Every input of every signature is batch-major except the scalar
    `beam_size`, `alpha` and `penalty_form` of `translate` and
    `controlled_search`, so TF Serving's request batcher can merge requests
    to every other signature. The sampling signatures run
    `sampling.sample_strings`.

    The module tracks the tf.Variables its traced signatures read, not the
    Keras model, as Keras's own `ExportArchive` does: TF Serving's loader (and
    `saved_model_cli run`) restores only variables saved that way; with the
    Keras model tracked instead, loading works in Python but TF Serving
    fails with "Could not find variable".

    Args:
        model: a trained `Transformer`; exported computing in float32 (`with_dtype_policy`).
        sentencepiece_path: str, the SentencePiece model used in training.
        max_source_length: int, source ids kept per sentence (EOS included).
        beam_size: int, beam size of `serving_default` and `nbest`.
        alpha: float, length penalty exponent of `serving_default` and `nbest`.
        num_hypotheses: int, hypotheses per sentence returned by `nbest`.
        chunk_size: int, the most sentences searched at once.
        extra_length: int, target pieces a sentence may produce beyond its
            source pieces (end of sentence included).
        tree_constraint: bool, a parser's searches write only well-formed
            trees over the input's words (`BracketConstraint`, built from the
            vocabulary's brackets and tags); sampling stays free. A parser
            vocabulary's list of tags (`corpus.tags_path`, kept when it
            also holds whole source words) ships beside it in assets/.
        tree_words: bool, the parser writes each word before its tag
            (`data.treebank_words`): the constrained searches copy the words
            from the source, and `kt parse` reads them back.
        quantize: str or None, "int8" or "int8-weights" to store the matrix
            weights in int8 (`pipelines.serving.quantization`); None keeps float32.
        lengths: dict or None, how lengths count in every search but sampling:
            `penalty_form`, `max_output_length`, `end_at_limit`
            (`translation.LENGTH_DEFAULTS`, `translate_strings`).
        signatures: iterable of str or None, the signatures the export holds
            (`signatures.SIGNATURES`); None holds all. Fewer signatures trace,
            save and load faster and take less space.

    Raises:
        ValueError: an unknown signature name.
    """

    def __init__(
        self,
        model,
        sentencepiece_path,
        max_source_length,
        beam_size=4,
        alpha=0.6,
        num_hypotheses=4,
        chunk_size=CHUNK_SIZE,
        extra_length=EXTRA_LENGTH,
        tree_constraint=False,
        tree_words=False,
        quantize=None,
        lengths=None,
        signatures=None,
    ):
        super().__init__(name="translator")
        names = chosen_signatures(signatures)
        lengths = {**LENGTH_DEFAULTS, **(lengths or {})}
        # What `export` records for clients (`client.export_settings`).
        self.search_settings = dict(
            beam_size=beam_size, alpha=alpha, nbest=num_hypotheses, extra_length=extra_length,
            max_source_length=max_source_length, tree_constraint=tree_constraint,
            tree_words=tree_words, quantize=quantize, **lengths, signatures=list(names),
        )  # fmt: skip
        model = _exported_model(model, sentencepiece_path, quantize)
        constraint = _constraint(sentencepiece_path, model.eos_id, tree_constraint, tree_words)
        # The file ships in assets/ for users and other runtimes; tf-text's tokenizer op takes
        # the proto as an attribute, so the graph holds its own copy of the same bytes.
        tokenizers = self._add_vocabularies(sentencepiece_path)

        translate = functools.partial(  # (sentences, beam_size, alpha, num_hypotheses, **options)
            translate_strings, model, tokenizers, lengths=lengths, constraint=constraint,
            max_source_length=max_source_length, chunk_size=chunk_size, extra_length=extra_length,
        )  # fmt: skip
        sentences_spec = tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)

        @tf.function(input_signature=[sentences_spec])
        def serve(inputs):
            texts, scores = translate(inputs, beam_size, alpha, 1)
            return {"translations": texts[:, 0], "scores": scores[:, 0]}

        @tf.function(input_signature=[sentences_spec])
        def nbest(inputs):
            texts, scores = translate(inputs, beam_size, alpha, num_hypotheses)
            return {"translations": texts, "scores": scores}

        @tf.function(
            input_signature=[
                sentences_spec,
                tf.TensorSpec([], tf.int32, name="beam_size"),
                tf.TensorSpec([], tf.float32, name="alpha"),
                tf.TensorSpec([], tf.string, name="penalty_form"),
            ]
        )
        def translate_with(inputs, beam_size, alpha, penalty_form):
            tf.debugging.assert_positive(beam_size, message="beam_size must be positive")
            form = {**lengths, "penalty_form": form_offset(penalty_form, lengths["penalty_form"])}
            texts, scores = translate(inputs, beam_size, alpha, 1, lengths=form)
            return {"translations": texts[:, 0], "scores": scores[:, 0]}

        pairs = [tf.TensorSpec([None], tf.string, name=name) for name in ("sources", "targets")]

        @tf.function(input_signature=pairs)
        def score(sources, targets):
            check_rows(sources, targets=targets)
            scores, lengths = score_strings(
                model, tokenizers, sources, targets, max_source_length, chunk_size
            )
            return {"scores": scores, "lengths": lengths}

        limits = (max_source_length, chunk_size, extra_length)
        guided = guided_signatures(translate, model, tokenizers, beam_size, alpha, limits)
        combined = combined_signatures(translate, model, tokenizers, limits, lengths)
        every = (serve, nbest, translate_with, score, *guided, *combined)
        functions = dict(zip(SIGNATURES, every, strict=True))
        # Only the chosen ones are tracked: `tf.saved_model.save` traces every tracked function.
        self.functions = {name: functions[name] for name in names}
        self.model_variables = _captured_variables(self.signatures().values())

    def estimated_bytes(self):
        """About the bytes an export takes, from above: weights, and the graph's vocabulary copies.

        The graph holds each SentencePiece model's bytes once for every
        function that tokenizes (measured: about 31 times the file for 10
        signatures), plus the ops themselves.
        """
        weights = sum(v.shape.num_elements() * v.dtype.size for v in self.model_variables)
        return weights + 4 * len(self.functions) * self.vocabulary_bytes + 2**20

    def _add_vocabularies(self, sentencepiece_path):
        """Tracks the vocabulary files as assets; returns the tokenizer or a `Sides` of two."""
        self.sentencepiece_model = tf.saved_model.Asset(sentencepiece_path)
        self.vocabulary_bytes = os.path.getsize(sentencepiece_path)
        self.parser_tags = _tags_asset(sentencepiece_path)  # beside it, for `kt parse`
        self.tokenizer = _tokenizer(sentencepiece_path)
        target_path = target_vocabulary_path(sentencepiece_path)
        if target_path == sentencepiece_path:
            return self.tokenizer
        # One a side (an imported Marian model).
        self.target_sentencepiece_model = tf.saved_model.Asset(target_path)
        self.vocabulary_bytes += os.path.getsize(target_path)
        # A name of its own: two tokenizers of one name share one model once the SavedModel
        # is loaded (tensorflow-text's kernel resource), and targets came out in source pieces.
        self.target_tokenizer = _tokenizer(target_path, name="target_tokenizer")
        return Sides(self.tokenizer, self.target_tokenizer)

    def signatures(self):
        """`{name: tf.function}` of the export's signatures, for `tf.saved_model.save`."""
        return dict(self.functions)


def _tokenizer(path, name=None):
    """A tensorflow-text tokenizer holding the SentencePiece file's bytes in the graph; one
    that keeps language codes whole for a vocabulary that has them (`LanguageCodes`)."""
    with open(path, "rb") as handle:
        tokenizer = tf_text.SentencepieceTokenizer(model=handle.read(), name=name)
    return LanguageCodes(tokenizer) if has_language_codes(path) else tokenizer


def _exported_model(model, sentencepiece_path, quantize):
    """`model` computing in float32, its special ids checked against the vocabulary's,
    quantized (a copy) with `quantize`."""
    check_special_ids(model, sentencepiece_path)
    model = with_dtype_policy(model, "float32")
    return model if quantize is None else quantized(model, quantize)


def _constraint(sentencepiece_path, eos_id, tree_constraint, copy_words):
    """A parser's `BracketConstraint`, or None without `tree_constraint` (imported here:
    translators need no tree reader)."""
    if not tree_constraint:
        return None
    from pipelines.parsing.corpus import bracket_constraint

    return bracket_constraint(sentencepiece_path, eos_id, copy_words)


def _tags_asset(sentencepiece_path):
    """The file listing a parser vocabulary's tags as an asset, or None if it has none."""
    from pipelines.parsing.corpus import tags_path

    path = tags_path(sentencepiece_path)
    return tf.saved_model.Asset(path) if os.path.exists(path) else None


def _captured_variables(functions):
    """The tf.Variables traced `tf.function`s read, deduplicated by handle (list)."""
    captured = {}
    for function in functions:
        for variable in function.get_concrete_function().variables:
            captured.setdefault(id(variable), variable)
    return list(captured.values())


def _space_message(base_dir, needed, what):
    return (
        f"{base_dir}: {what}: the export needs about {needed / 2**20:.0f} MiB and "
        f"{free_bytes(base_dir) / 2**20:.0f} MiB are free"
    )


def export(translator, base_dir, version=None, batching=False):
    """Writes `translator` to `base_dir/VERSION/`, atomically.

    The SavedModel is written to a hidden staging folder beside the versions
    and renamed into place, so TF Serving, which polls `base_dir` for new
    versions, never sees a half-written one. An existing version is never
    overwritten: with `version=None`, an export that loses the race for a
    number to another export takes the next free one. Staging folders left by
    killed exports are removed first.

    Args:
        translator: a `Translator`.
        base_dir: str, the model's folder, e.g. `saved_models/default`.
        version: int or None, defaults to `next_version(base_dir)`.
        batching: bool, the version is for TF Serving's `--enable_batching`:
            its warm-up requests leave out `translate` and
            `controlled_search`, which the batcher refuses (see
            `pipelines.serving.warmup`).

    Returns:
        str, the version's folder.

    Raises:
        ExportError: `version` is given and taken, or the disk has less
            space than the export needs (checked before writing, and
            caught while writing).
    """
    check_version(base_dir, version)
    needed = translator.estimated_bytes()
    if free_bytes(base_dir) < needed:  # before anything is written
        raise ExportError(_space_message(base_dir, needed, "not enough space"))
    staging = staging_folder(base_dir)
    try:
        try:
            # No gradient functions: the export only infers, and Keras's int8 layers trace
            # one per product (192 in a two-signature export of the multi30k recipe's shape,
            # which loaded as 53 MiB).
            options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
            tf.saved_model.save(
                translator, staging, signatures=translator.signatures(), options=options
            )
            write_warmup_requests(staging, batching, tuple(translator.functions))
            settings = {**translator.search_settings, "batching": batching}
            write_json(os.path.join(staging, SETTINGS_FILE), settings)
        except (tf.errors.ResourceExhaustedError, OSError) as error:
            full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            if not (full or "space left" in str(error) or "quota" in str(error).lower()):
                raise
            raise ExportError(_space_message(base_dir, needed, "the disk filled up")) from None
        while True:
            number = next_version(base_dir) if version is None else version
            target = os.path.join(base_dir, str(number))
            try:
                # Atomic; fails when another export has just taken the number.
                os.rename(staging, target)
                return target
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if version is not None:
                    raise ExportError(
                        f"{target} already exists; choose another --version"
                    ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
