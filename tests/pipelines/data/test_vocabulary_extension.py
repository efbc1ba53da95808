"""A trained vocabulary grown with the pieces of new data: old ids kept, new text without unk."""

import pytest
import sentencepiece as spm

from pipelines.data.default_corpus import generate_pairs
from pipelines.data.tokenizer import train_sentencepiece
from pipelines.data.vocabulary_extension import extended_model, spellings
from pipelines.errors import DataError


def sentences(locale, count=1500):
    return [s for pair in generate_pairs(count, seed=0, target_locale=locale) for s in pair]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A German-only vocabulary, one trained on Swiss German renderings, and the grown one."""
    folder = tmp_path_factory.mktemp("grow")
    old = train_sentencepiece(sentences("de"), str(folder / "old.model"), vocabulary_size=200)
    new = train_sentencepiece(sentences("de_CH"), str(folder / "new.model"), vocabulary_size=150)
    data, added = extended_model(old, (folder / "new.model").read_bytes())
    (folder / "grown.model").write_bytes(data)
    return old, new, str(folder / "grown.model"), added


def processor(path):
    return spm.SentencePieceProcessor(model_file=path)


def test_old_pieces_keep_their_ids_and_the_new_ones_follow(models):
    old, new, grown, added = models
    old, new, grown = processor(old), processor(new), processor(grown)
    size = old.get_piece_size()
    assert added and grown.get_piece_size() == size + len(added)
    for i in range(size):
        assert (grown.id_to_piece(i), grown.get_score(i)) == (old.id_to_piece(i), old.get_score(i))
    new_pieces = {new.id_to_piece(i) for i in range(new.get_piece_size())}
    old_pieces = {old.id_to_piece(i) for i in range(size)}
    assert set(added) <= new_pieces - old_pieces
    assert [grown.id_to_piece(size + i) for i in range(len(added))] == added
    # New BPE pieces rank below every old merge, in the new vocabulary's order.
    scores = [grown.get_score(size + i) for i in range(len(added))]
    assert max(scores) < min(old.get_score(i) for i in range(4, size))
    assert scores == sorted(scores, reverse=True)


def test_the_new_domain_loses_its_unknown_characters(models):
    old, _, grown, added = models
    old, grown = processor(old), processor(grown)
    text = "Das kostet 1'234.50 Franken."
    assert old.unk_id() in old.encode(text)  # the apostrophe: unknown to German renderings
    assert "'" in added or any("'" in piece for piece in added)
    assert grown.unk_id() not in grown.encode(text)
    assert grown.decode(grown.encode(text)) == text
    # Text of the source's domain still reads back the same.
    for german in sentences("de", 200):
        assert grown.decode(grown.encode(german)) == old.decode(old.encode(german)) == german


def test_spellings_are_the_old_vocabularys_ids_for_each_new_piece(models):
    old_path, _, _, _ = models
    old = processor(old_path)
    mark = old.piece_to_id("\u2581")
    word = next(p for p in ["\u2581Franken", "\u2581Betrag"] if old.piece_to_id(p) == old.unk_id())
    found = spellings(old_path, [word, "'", "ken"])
    assert found[0] == old.encode(word[1:])  # a word-initial piece: written as a word
    assert found[1] == [old.unk_id()]  # an unknown character alone: the word mark dropped
    inside = old.encode("ken")
    assert found[2] == (inside[1:] if inside[0] == mark and len(inside) > 1 else inside)


def test_a_vocabulary_of_another_type_is_refused(models, tmp_path):
    old, _, _, _ = models
    unigram = train_sentencepiece(
        sentences("de_CH", 300), str(tmp_path / "u.model"), vocabulary_size=120,
        model_type="unigram",
    )  # fmt: skip
    with pytest.raises(DataError, match="is a bpe model, the new data's vocabulary a unigram"):
        extended_model(old, (tmp_path / "u.model").read_bytes())
    assert unigram


def test_byte_fallback_and_character_coverage_reach_a_runs_vocabulary(tmp_path):
    """The run settings `byte_fallback` and `character_coverage` train the run's vocabulary."""
    from pipelines.training.data import train_vocabulary
    from pipelines.training.loading import load_config

    pairs = generate_pairs(600, seed=0)
    config = load_config("default", settings={"vocabulary_size": 400, "byte_fallback": True})
    path = str(tmp_path / "bytes.model")
    train_vocabulary(config, lambda: iter(pairs), path)
    grown = processor(path)
    assert grown.piece_to_id("<0x27>") != grown.unk_id()  # 256 byte pieces
    ids = grown.encode("1'234 \u00a7")  # characters the German renderings lack
    assert grown.unk_id() not in ids and grown.decode(ids) == "1'234 \u00a7"
    config = load_config("default", settings={"vocabulary_size": 200})
    train_vocabulary(config, lambda: iter(pairs), str(tmp_path / "plain.model"))
    assert processor(str(tmp_path / "plain.model")).unk_id() in processor(
        str(tmp_path / "plain.model")
    ).encode("\u00a7")
    # A coverage below 1 leaves the rarest characters out: `unk`, where 1.0 keeps them all.
    config = load_config("default", settings={"vocabulary_size": 200, "character_coverage": 0.99})
    train_vocabulary(config, lambda: iter(pairs), str(tmp_path / "rare.model"))
    rare, full = processor(str(tmp_path / "rare.model")), processor(str(tmp_path / "plain.model"))
    characters = {c for pair in pairs for s in pair for c in s if not c.isspace()}
    dropped = [c for c in characters if rare.encode(c)[-1:] == [rare.unk_id()]]
    assert dropped and not [c for c in characters if full.encode(c)[-1:] == [full.unk_id()]]
