"""Translating with a Keras model in-graph, and scoring with sacreBLEU."""

import sacrebleu
import tensorflow as tf

from pipelines.translation import translate_strings


def translate(model, tokenizer, sentences, batch_size=1024, max_length=None):
    """Greedy translations of a list of sentences, in order.

    Args:
        model: a trained `Transformer`.
        tokenizer: tensorflow-text tokenizer used in training.
        sentences: list of str.
        batch_size: int, sentences per call of the graph, which searches
            them in length-sorted chunks.
        max_length: int or None, longest source kept (in tokens, EOS included).

    Returns:
        list of str, one translation per sentence.
    """

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def decode(batch):
        texts, _ = translate_strings(
            model, tokenizer, batch, beam_size=1, alpha=0.0, max_source_length=max_length
        )
        return texts[:, 0]

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
