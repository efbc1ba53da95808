import babel
import pytest

from pipelines.data.default_corpus import default_corpus, generate_pairs
from pipelines.errors import DataError


def test_deterministic_by_seed():
    assert generate_pairs(200, seed=3) == generate_pairs(200, seed=3)
    assert generate_pairs(200, seed=3) != generate_pairs(200, seed=4)


def test_splits_do_not_overlap():
    splits = default_corpus((2000, 200, 200), seed=1)
    sources = {name: {s for s, _ in pairs} for name, pairs in splits.items()}
    assert [len(splits[name]) for name in ("train", "validation", "test")] == [2000, 200, 200]
    assert not sources["train"] & sources["validation"]
    assert not sources["train"] & sources["test"]
    assert not sources["validation"] & sources["test"]


def test_targets_use_the_locale_data():
    pairs = generate_pairs(3000, "de", seed=0)
    german = babel.Locale("de")
    months = set(german.months["format"]["wide"].values())
    weekdays = set(german.days["format"]["wide"].values())
    targets = " ".join(t for _, t in pairs)
    assert any(month in targets for month in months - {"April", "August", "September"})
    assert any(day in targets for day in weekdays)
    # English decimal points become German decimal commas.
    money = [(s, t) for s, t in pairs if s.startswith("€") and "." in s]
    assert money and all("," in t and t.endswith("€") for _, t in money)
    assert not any("\u00a0" in t or "\u202f" in t for _, t in pairs)


def test_other_locales_and_bad_locale():
    french = " ".join(t for _, t in generate_pairs(500, "fr", seed=0))
    assert any(m in french for m in babel.Locale("fr").months["format"]["wide"].values())
    with pytest.raises(DataError, match="Unknown CLDR locale 'xx_nowhere'"):
        generate_pairs(5, "xx_nowhere")
