"""`keras_transformer.tokenizers`: the model's ids from text and back, on every backend."""

import numpy as np
import pytest
import sentencepiece as spm

from keras_transformer import Transformer, greedy_search
from keras_transformer.tokenizers import SPECIAL_IDS, SentencePieceTokenizer, train_sentencepiece

PAIRS = [
    ("A dog runs on the grass.", "Ein Hund rennt auf dem Gras."),
    ("Two men play football.", "Zwei Männer spielen Fußball."),
    ("A woman reads a book.", "Eine Frau liest ein Buch."),
    ("Children swim in the lake.", "Kinder schwimmen im See."),
] * 30


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocabulary") / "vocab.model"
    texts = [text for pair in PAIRS for text in pair]
    return train_sentencepiece(iter(texts), str(path), vocabulary_size=120)


def test_the_special_ids_are_the_models(tokenizer):
    processor = spm.SentencePieceProcessor(model_file=tokenizer.model_path)
    pieces = {name: processor.id_to_piece(index) for name, index in SPECIAL_IDS.items()}
    assert pieces == {"pad_id": "<pad>", "unk_id": "<unk>", "bos_id": "<s>", "eos_id": "</s>"}
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert tokenizer.vocabulary_size == 120


def test_sources_and_targets_are_padded_arrays_of_sentencepieces_ids(tokenizer):
    processor = spm.SentencePieceProcessor(model_file=tokenizer.model_path)
    texts = ["A dog reads.", "Two women swim in the lake on the grass."]
    pieces = [processor.encode(text) for text in texts]  # the reference: SentencePiece itself
    sources = tokenizer.encode_sources(texts)
    assert sources.dtype == np.int32 and sources.shape == (2, max(map(len, pieces)) + 1)
    for row, ids in zip(sources, pieces, strict=True):
        assert list(row) == ids + [3] + [0] * (sources.shape[1] - len(ids) - 1)
    inputs, labels = tokenizer.encode_targets(texts)
    assert inputs.shape == labels.shape == sources.shape
    for row_in, row_out, ids in zip(inputs, labels, pieces, strict=True):
        assert list(row_in[: len(ids) + 1]) == [2] + ids and set(row_in[len(ids) + 1 :]) <= {0}
        assert list(row_out[: len(ids) + 1]) == ids + [3]  # the inputs shifted by one
    cut = tokenizer.encode_sources(texts, max_length=4)
    assert cut.shape == (2, 4) and list(cut[:, -1]) == [3, 3]
    cut_inputs, cut_labels = tokenizer.encode_targets(texts, max_length=4)
    assert list(cut_inputs[1]) == [2] + pieces[1][:3] and list(cut_labels[1]) == pieces[1][:3] + [3]


def test_decode_stops_at_the_end_and_drops_padding(tokenizer):
    texts = ["A dog runs on the grass.", "Kinder schwimmen."]
    _, labels = tokenizer.encode_targets(texts)  # pieces, end, padding: a search's output
    assert tokenizer.decode(labels) == texts
    noisy = np.concatenate([labels, np.full((2, 3), 7, "int32")], axis=1)  # after the end
    assert tokenizer.decode(noisy) == texts
    hypotheses = np.stack([labels, labels[::-1]], axis=1)  # (B, N, T)
    assert tokenizer.decode(hypotheses) == [texts, texts[::-1]]
    assert tokenizer.decode([[2, 1, 3]]) == [" ⁇ "]  # the unknown piece, as SentencePiece writes it
    assert tokenizer.decode([[2, 3], labels[0].tolist()]) == ["", texts[0]]  # ragged lists


def test_a_model_takes_the_arrays_and_its_search_output_decodes_to_text(tokenizer):
    model = Transformer.from_preset(
        "transformer_small", vocabulary_size=tokenizer.vocabulary_size, num_layers=1,
        hidden_dim=16, intermediate_dim=32, num_heads=2,
    )  # fmt: skip
    sources = tokenizer.encode_sources([source for source, _ in PAIRS[:4]])
    inputs, labels = tokenizer.encode_targets([target for _, target in PAIRS[:4]])
    logits = model((sources, inputs))
    assert tuple(logits.shape) == (*labels.shape, tokenizer.vocabulary_size)
    tokens = np.asarray(greedy_search(model, sources, extra_length=5))
    processor = spm.SentencePieceProcessor(model_file=tokenizer.model_path)
    expected = []
    for row in tokens.tolist():
        ends = row.index(3) if 3 in row else len(row)
        expected.append(processor.decode([i for i in row[:ends] if i != 0]))
    assert tokenizer.decode(greedy_search(model, sources, extra_length=5)) == expected


def test_files_train_the_same_vocabulary_as_an_iterator(tokenizer, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("\n".join(text for pair in PAIRS for text in pair) + "\n", encoding="utf-8")
    from_files = train_sentencepiece(
        files=[str(path)], model_path=str(tmp_path / "f.model"), vocabulary_size=120
    )
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(120)]
    assert [from_files.processor.id_to_piece(i) for i in range(120)] == pieces


def test_bad_settings_and_files_are_named(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="texts or files"):
        train_sentencepiece(model_path=str(tmp_path / "x.model"))
    with pytest.raises(ValueError, match=r"do not set \['pad_id'\]"):
        train_sentencepiece(["a"], str(tmp_path / "x.model"), pad_id=3)
    with pytest.raises(ValueError, match="SentencePiece training failed"):
        train_sentencepiece(["", ""], str(tmp_path / "x.model"), vocabulary_size=50)
    assert not (tmp_path / "x.model").exists()  # nothing written by a failed training
    plain = tmp_path / "plain"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in PAIRS for text in pair]),
        model_prefix=str(plain), vocab_size=60, minloglevel=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match="plain.model: special ids .*'unk_id': 0"):
        SentencePieceTokenizer(f"{plain}.model")
