"""Evaluation in one place: in-graph translation of a Keras model, BLEU and chrF.

Scores are sacreBLEU's corpus BLEU and chrF with their signatures, so a number
in a result file says how it was computed.
"""

import sacrebleu

from pipelines.errors import DataError


def translate(
    model,
    tokenizer,
    sentences,
    batch_size=1024,
    max_source_length=None,
    beam_size=1,
    alpha=0.0,
    extra_length=None,
    constraint=None,
):
    """Translations of a list of sentences, in order (greedy unless `beam_size` > 1).

    Args:
        model: a trained `Transformer`.
        tokenizer: tensorflow-text tokenizer used in training.
        sentences: list of str.
        batch_size: int, sentences per call of the graph, which searches
            them in length-sorted chunks.
        max_source_length: int or None, longest source kept (in tokens, EOS included).
        beam_size: int, 1 for greedy search.
        alpha: float, beam search's length penalty exponent.
        extra_length: int or None, target pieces beyond the source pieces
            (None: translation's 50).
        constraint: callable or None, restricts the search's next tokens
            (a parser's `BracketConstraint`).

    Returns:
        list of str, one translation per sentence.
    """
    # Imported here: scoring files (`kt evaluate`) needs no TensorFlow.
    import keras
    import tensorflow as tf

    from pipelines.serving.translation import EXTRA_LENGTH, translate_strings

    options = {
        "extra_length": EXTRA_LENGTH if extra_length is None else extra_length,
        "constraint": constraint,
    }
    if keras.backend.backend() != "tensorflow":  # a model trained on JAX
        return _translate_by_chunks(
            model, tokenizer, sentences, max_source_length, beam_size, alpha, **options
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def decode(batch):
        texts, _ = translate_strings(
            model,
            tokenizer,
            batch,
            beam_size,
            alpha,
            max_source_length=max_source_length,
            **options,
        )
        return texts[:, 0]

    outputs = []
    for start in range(0, len(sentences), batch_size):
        batch = tf.constant(sentences[start : start + batch_size])
        outputs.extend(text.decode("utf-8") for text in decode(batch).numpy())
    return outputs


def _translate_by_chunks(
    model, tokenizer, sentences, max_source_length, beam_size, alpha, extra_length, constraint
):
    """`translate` for a model of another backend: TensorFlow tokenizes, the backend searches.

    The graph of `translate_strings` holds TensorFlow ops only; here the
    searches run eagerly on the model's backend, on length-sorted chunks of
    `CHUNK_SIZE` sentences (not `translate`'s `batch_size`), with the same
    encoding, limits, decoding and blank sentences.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.decoding import beam_search, greedy_search
    from pipelines.serving.translation import CHUNK_SIZE, blank_sentences, decode, encode

    batch = tf.constant(sentences, tf.string)
    source = encode(tokenizer, batch, model.eos_id, max_source_length)
    blank = blank_sentences(batch).numpy()  # (B,), as the graph tests them
    order = np.argsort(source.row_lengths().numpy(), kind="stable")
    outputs = [""] * len(sentences)
    options = {"alpha": alpha, "extra_length": extra_length, "constraint": constraint}
    for start in range(0, len(order), CHUNK_SIZE):
        rows = order[start : start + CHUNK_SIZE]
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id).numpy()  # (C, S)
        if beam_size == 1:
            tokens = greedy_search(model, source_ids, **options)  # (C, T)
        else:
            tokens = beam_search(model, source_ids, beam_size=beam_size, **options)[0][:, 0]
        texts = decode(tokenizer, tf.constant(keras.ops.convert_to_numpy(tokens)), model.eos_id)
        for row, text in zip(rows, texts.numpy(), strict=True):
            if not blank[row]:  # a blank sentence translates to "", as in the graph
                outputs[row] = text.decode("utf-8")
    return outputs


def score(hypotheses, references, lowercase=False):
    """Corpus BLEU and chrF of aligned lists of str.

    Args:
        hypotheses: list of str, one translation per sentence.
        references: list of str, aligned with `hypotheses`.
        lowercase: bool, compare lowercased text.

    Returns:
        dict with `bleu`, `chrf` (floats, rounded to 2 decimals), their
        `*_signature` strings and `sentences`.

    Raises:
        DataError: the two lists differ in length.
    """
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
    chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
    return {
        "bleu": round(bleu.corpus_score(hypotheses, [references]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf.corpus_score(hypotheses, [references]).score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }
