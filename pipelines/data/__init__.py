"""Corpora, the embedded default corpus, SentencePiece tokenization and tf.data batching."""
