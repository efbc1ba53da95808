"""The embedded default corpus: dates, times, numbers, money and quantities.

English expressions paired with their renderings in a target locale, both
written by the Unicode CLDR data that Babel ships: real month and weekday
names, day/month order, 24-hour clocks, decimal and grouping separators,
currency placement and unit names. It needs no network and no download, is
deterministic by seed, and makes a translation task a small model learns in
minutes: reorder fields, map names, and copy or re-punctuate digits.
"""

import datetime
import random

from babel import Locale, UnknownLocaleError, dates, numbers, units

from pipelines.errors import DataError

SOURCE_LOCALE = "en"
DATE_FORMATS = ("full", "long", "medium", "short")
TIME_FORMATS = ("short", "medium")
CURRENCIES = ("EUR", "USD", "GBP", "JPY", "CHF")
UNITS = (
    "length-kilometer",
    "length-meter",
    "length-centimeter",
    "mass-kilogram",
    "mass-gram",
    "volume-liter",
    "duration-hour",
    "duration-minute",
    "duration-day",
    "temperature-celsius",
    "speed-kilometer-per-hour",
)
# CLDR separates some fields with no-break spaces (U+00A0, U+202F); they are
# written as plain spaces so that references and detokenized output agree.
_SPACES = str.maketrans({"\u00a0": " ", "\u202f": " "})


def _random_datetime(rng):
    start = datetime.datetime(1950, 1, 1)
    return start + datetime.timedelta(days=rng.randrange(100 * 365), minutes=rng.randrange(24 * 60))


def _random_number(rng):
    digits = rng.choice((1, 2, 3, 4, 5, 6, 7))
    value = rng.randrange(10 ** (digits - 1), 10**digits)
    decimals = rng.choice((0, 0, 1, 2))
    return value / 10**decimals, decimals


def _date(rng, locale):
    moment, style = _random_datetime(rng), rng.choice(DATE_FORMATS)
    return lambda loc: dates.format_date(moment, style, locale=loc)


def _time(rng, locale):
    moment, style = _random_datetime(rng), rng.choice(TIME_FORMATS)
    return lambda loc: dates.format_time(moment, style, locale=loc)


def _datetime(rng, locale):
    moment = _random_datetime(rng)
    date_style, time_style = rng.choice(("full", "long", "medium")), "short"

    def render(loc):
        # CLDR quotes literal words in patterns ("{1} 'at' {0}").
        pattern = str(Locale.parse(loc).datetime_formats[date_style]).replace("'", "")
        return pattern.replace("{1}", dates.format_date(moment, date_style, locale=loc)).replace(
            "{0}", dates.format_time(moment, time_style, locale=loc)
        )

    return render


def _number(rng, locale):
    value, decimals = _random_number(rng)
    pattern = "#,##0" + ("." + "0" * decimals if decimals else "")
    return lambda loc: numbers.format_decimal(value, pattern, locale=loc)


def _percent(rng, locale):
    value = rng.randrange(0, 1000) / 1000
    return lambda loc: numbers.format_percent(value, "#,##0.#%", locale=loc)


def _currency(rng, locale):
    value, _ = _random_number(rng)
    currency = rng.choice(CURRENCIES)
    return lambda loc: numbers.format_currency(value, currency, locale=loc)


def _quantity(rng, locale):
    value = rng.choice((rng.randrange(1, 1000), rng.randrange(1, 10000) / 10))
    unit, length = rng.choice(UNITS), rng.choice(("long", "short"))
    return lambda loc: units.format_unit(value, unit, length=length, locale=loc)


KINDS = {
    "date": _date,
    "time": _time,
    "datetime": _datetime,
    "number": _number,
    "percent": _percent,
    "currency": _currency,
    "quantity": _quantity,
}


# (train, validation, test) pairs of the default corpus; `TrainConfig` uses them too.
DEFAULT_SIZES = (20000, 500, 500)


def generate_pairs(num_pairs, target_locale="de", seed=0):
    """Generates distinct English -> `target_locale` expression pairs.

    Args:
        num_pairs: int, how many pairs.
        target_locale: str, a CLDR locale such as "de", "fr" or "ja".
        seed: int, the same seed gives the same pairs.

    Returns:
        list of `(source, target)` str pairs with distinct sources.

    Example:
    >>> pairs = generate_pairs(3, "de", seed=1)
    >>> len(pairs), len({source for source, _ in pairs})
    (3, 3)
    """
    try:
        Locale.parse(target_locale)
    except (UnknownLocaleError, ValueError):
        raise DataError(f"Unknown CLDR locale {target_locale!r}") from None
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    pairs, seen = [], set()
    for _ in range(num_pairs * 20):
        render = KINDS[rng.choice(kinds)](rng, target_locale)
        source = render(SOURCE_LOCALE).translate(_SPACES)
        if source in seen:
            continue
        seen.add(source)
        pairs.append((source, render(target_locale).translate(_SPACES)))
        if len(pairs) == num_pairs:
            return pairs
    raise DataError(f"Could not generate {num_pairs} distinct pairs")


def default_corpus(sizes=DEFAULT_SIZES, target_locale="de", seed=0):
    """The default corpus split into train, validation and test without overlap.

    Args:
        sizes: `(train, validation, test)` pair counts.
        target_locale: str, CLDR locale of the targets.
        seed: int.

    Returns:
        dict with keys "train", "validation", "test" of `(source, target)` pairs;
        no source sentence appears in two splits.
    """
    pairs = generate_pairs(sum(sizes), target_locale, seed)
    train, validation = sizes[0], sizes[0] + sizes[1]
    return {
        "train": pairs[:train],
        "validation": pairs[train:validation],
        "test": pairs[validation:],
    }
