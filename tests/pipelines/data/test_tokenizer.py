import collections

import pytest
import sentencepiece as spm
import tensorflow as tf

from pipelines.data.default_corpus import generate_pairs
from pipelines.data.tokenizer import (
    check_special_ids,
    frequent_words,
    load_tokenizer,
    train_sentencepiece,
    vocabulary_size,
)
from pipelines.errors import DataError


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    pairs = generate_pairs(3000, seed=0)
    path = str(tmp_path_factory.mktemp("spm") / "sp.model")
    return train_sentencepiece([s for pair in pairs for s in pair], path, vocabulary_size=300)


def test_special_ids_match_the_model_defaults(model_path):
    processor = spm.SentencePieceProcessor(model_file=model_path)
    assert [processor.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert vocabulary_size(model_path) == 300


def test_a_model_is_checked_against_the_vocabularys_special_ids(model_path):
    ids = collections.namedtuple("Ids", "pad_id bos_id eos_id")
    check_special_ids(ids(0, 2, 3), model_path)  # the vocabulary's: no error
    with pytest.raises(DataError, match="special ids .* differ from those of"):
        check_special_ids(ids(0, 1, 2), model_path)
    with pytest.raises(DataError, match="the model has no pad_id: not a keras_transformer"):
        check_special_ids(object(), model_path)


def test_in_graph_tokenizer_equals_sentencepiece(model_path):
    processor = spm.SentencePieceProcessor(model_file=model_path)
    sentences = ["Monday, March 4, 2024", "€1,234.50", "17. März 1999, 14:07", "ünïcödé ✓"]
    tokenizer = load_tokenizer(model_path)
    ids = tokenizer.tokenize(tf.constant(sentences)).to_list()
    assert ids == processor.encode(sentences)
    # Digits are pieces of their own.
    assert all(len(processor.id_to_piece(i).strip("▁")) <= 1 for i in processor.encode("2024"))
    back = tokenizer.detokenize(tf.ragged.constant(ids)).numpy()
    assert [b.decode() for b in back[:3]] == sentences[:3]


def test_training_is_deterministic(model_path, tmp_path):
    pairs = generate_pairs(3000, seed=0)
    again = train_sentencepiece(
        [s for pair in pairs for s in pair], str(tmp_path / "again.model"), vocabulary_size=300
    )
    first = spm.SentencePieceProcessor(model_file=model_path)
    second = spm.SentencePieceProcessor(model_file=again)
    pieces = lambda p: [p.id_to_piece(i) for i in range(p.get_piece_size())]  # noqa: E731
    assert pieces(first) == pieces(second)


def test_errors(tmp_path):
    with pytest.raises(DataError, match="empty corpus"):
        train_sentencepiece(["", ""], str(tmp_path / "x.model"))
    with pytest.raises(DataError, match="Vocabulary size too high"):
        train_sentencepiece(["a b c"] * 10, str(tmp_path / "x.model"), vocabulary_size=5000)
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(str(tmp_path / "missing.model"))


def test_whole_tokens_are_one_piece_each_and_words_stay_subwords(model_path, tmp_path):
    pairs = generate_pairs(3000, seed=0)
    targets = ["(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S", "(FRAG (NP XX )NP )FRAG"] * 50
    sentences = [s for pair in pairs for s in pair] + targets
    whole = {token for target in targets for token in target.split()}
    path = train_sentencepiece(
        sentences, str(tmp_path / "whole.model"), vocabulary_size=300, whole_tokens=whole
    )
    processor = spm.SentencePieceProcessor(model_file=path)
    for target in targets[:2]:
        pieces = processor.encode(target, out_type=str)
        assert pieces == ["▁" + token for token in target.split()]
        assert processor.decode(processor.encode(target)) == target
    # Without them, the same line is cut into many more pieces.
    plain = spm.SentencePieceProcessor(model_file=model_path)
    assert len(plain.encode(targets[0])) > 2 * len(targets[0].split())
    # Sentences are still cut into subwords.
    assert len(processor.encode(pairs[0][0])) > len(pairs[0][0].split())


def test_frequent_words_most_frequent_first_ties_in_order_of_appearance(tmp_path):
    sentences = ["b a c a", "d c a e", "b"]
    assert frequent_words(sentences, 3) == ["a", "b", "c"]  # a 3; b, c 2 (b first)
    assert frequent_words(sentences, 10) == ["a", "b", "c", "d", "e"]
    assert frequent_words(sentences, 0) == []
    # Kept whole, the frequent words are one piece each and the others still subwords.
    pairs = generate_pairs(3000, seed=0)
    corpus = [s for pair in pairs for s in pair]
    words = frequent_words(corpus, 60)
    path = train_sentencepiece(
        corpus, str(tmp_path / "words.model"), vocabulary_size=250, whole_tokens=words
    )
    processor = spm.SentencePieceProcessor(model_file=path)
    assert all(processor.encode(word, out_type=str) == ["▁" + word] for word in words)
    counts = collections.Counter(word for sentence in corpus for word in sentence.split())
    others = [w for w in counts if w not in words and len(w) > 3]
    assert others and sum(len(processor.encode(w)) > 1 for w in others) > len(others) / 2
    # SentencePiece matches kept words as prefixes: a word that begins with one is cut after it.
    kept = max(words, key=len)
    assert processor.encode(kept + "qz", out_type=str)[0] == "▁" + kept
