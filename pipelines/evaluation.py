"""Translating with a Keras model in-graph, and scoring with sacreBLEU."""

import sacrebleu
import tensorflow as tf

from keras_transformer.decoding import greedy_search
from pipelines.tokenizer import EOS_ID, decode_targets, encode_sources


def translate(model, tokenizer, sentences, batch_size=64, max_length=None):
    """Greedy translations of a list of sentences, in order.

    Args:
        model: a trained `Transformer`.
        tokenizer: tensorflow-text tokenizer used in training.
        sentences: list of str.
        batch_size: int, sentences per decoding batch.
        max_length: int or None, longest source kept (in tokens, EOS included).

    Returns:
        list of str, one translation per sentence.
    """

    @tf.function(reduce_retracing=True)
    def decode(batch):
        source = encode_sources(tokenizer, batch, EOS_ID, max_length)  # (B, S)
        tokens = greedy_search(model, source)  # (B, T)
        return decode_targets(tokenizer, tokens, EOS_ID)

    outputs = []
    for start in range(0, len(sentences), batch_size):
        batch = tf.constant(sentences[start : start + batch_size])
        outputs.extend(text.decode("utf-8") for text in decode(batch).numpy())
    return outputs


def bleu(hypotheses, references, lowercase=False):
    """Corpus BLEU from sacreBLEU with its signature.

    Returns:
        `(score, signature)`, float and str.
    """
    metric = sacrebleu.metrics.BLEU(lowercase=lowercase)
    score = metric.corpus_score(hypotheses, [references])
    return score.score, str(metric.get_signature())
