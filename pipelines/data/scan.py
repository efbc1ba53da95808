"""One streaming pass over the training corpora: checks, counts, and the vocabulary's sample.

The pass reads every line once and keeps nothing but counters and a bounded
sample, so it runs before any other work on a corpus of any size: a file that
is not UTF-8 or two files that are not aligned fail here, naming file and
line, before minutes of tokenization. The sample is drawn by reservoir
(Vitter's Algorithm L, which draws random numbers only for the lines it
keeps), seeded by the run's seed, from each corpus; it is then cut to the
corpora's shares of the training stream (`mixing_shares`).

SentencePiece can sample too (`input_sentence_size`), but only from
sentences it has already loaded, so it would hold the whole corpus.
"""

import logging
import math

import numpy as np

from pipelines.data.corpus import MAX_CHARACTERS
from pipelines.data.progress import Progress
from pipelines.errors import DataError

logger = logging.getLogger(__name__)


class Reservoir:
    """A uniform random sample of at most `size` items from a stream of unknown length.

    Algorithm L (Li, 1994): the first `size` items fill the sample in stream
    order; after that each kept item replaces a random one, and the gaps
    between kept items are drawn from their distribution, so the cost is one
    comparison an item. A stream of `size` items or fewer is kept whole, in
    order.

    Args:
        size: int, the most items kept.
        rng: `numpy.random.Generator`.
    """

    def __init__(self, size, rng):
        self.size, self.rng = size, rng
        self.items = []
        self.seen = 0
        self._weight = math.exp(math.log(self._uniform()) / size) if size else 0.0
        self._next = size + self._gap()

    def _uniform(self):
        return 1.0 - self.rng.random()  # in (0, 1]: log() is finite

    def _gap(self):
        if not self.size or self._weight >= 1.0:
            return 0
        return int(math.log(self._uniform()) / math.log1p(-self._weight))

    def add(self, item):
        """Offers the next item of the stream."""
        if self.seen < self.size:
            self.items.append(item)
        elif self.seen == self._next and self.size:
            self.items[int(self.rng.integers(self.size))] = item
            self._weight *= math.exp(math.log(self._uniform()) / self.size)
            self._next += self._gap() + 1
        self.seen += 1


def mixing_shares(corpora, pairs):
    """Each corpus's share of the training stream.

    Args:
        corpora: list of `Corpus`; their weights are all None (in proportion
            to size) or all set.
        pairs: list of int, each corpus's non-empty pairs.

    Returns:
        list of float, summing to 1.
    """
    weights = [c.weight if c.weight is not None else n for c, n in zip(corpora, pairs, strict=True)]
    return [w / sum(weights) for w in weights]


def scan(corpora, sample_size, seed):
    """Checks and counts every corpus in one pass; draws the vocabulary's sample.

    Args:
        corpora: list of `Corpus`.
        sample_size: int, pairs sampled from all corpora together, shared
            out by `mixing_shares`; a corpus gives all its pairs at most.
            Memory: a reservoir of `sample_size` pairs a corpus (of its share
            of them where the corpora have weights).
        seed: int, the sampling seed.

    Returns:
        dict with `lines` and `pairs` (lists of int, per corpus: lines read,
        pairs kept: both sides non-empty and within `MAX_CHARACTERS`) and
        `sample` (list of `(source, target)` str pairs; a corpus that the
        sample takes whole comes in its order).

    Raises:
        DataError: a file is missing or undecodable, files are not aligned, or
            a corpus has no non-empty pair.
    """
    reservoirs, lines = [], []
    # With weights the shares are known before counting: each reservoir holds its share.
    sizes = [sample_size] * len(corpora)
    if corpora and corpora[0].weight is not None:
        sizes = [
            math.ceil(sample_size * share) for share in mixing_shares(corpora, [0] * len(corpora))
        ]
    for index, corpus in enumerate(corpora):
        reservoir = Reservoir(sizes[index], np.random.default_rng([seed, index]))
        progress = Progress(f"Checking {corpus.name}", unit="lines")
        count = empty = 0
        for count, (source, target) in enumerate(corpus.lines(), start=1):  # noqa: B007
            if count % 100_000 == 0:
                progress.update(100_000)
            if not (source and target):
                empty += 1
            elif len(source) <= MAX_CHARACTERS and len(target) <= MAX_CHARACTERS:
                reservoir.add((source, target))
        if not reservoir.seen:
            raise DataError(f"No sentence pairs in {corpus.name}: the corpus is empty")
        if empty:
            logger.warning(
                "Dropped %d of %d pairs with an empty side from %s", empty, count, corpus.name
            )
        if count - empty - reservoir.seen:
            logger.warning(
                "Dropped %d pairs with a side over %d characters from %s",
                count - empty - reservoir.seen,
                MAX_CHARACTERS,
                corpus.name,
            )
        logger.info("%s: %s pairs", corpus.name, f"{reservoir.seen:,}")
        reservoirs.append(reservoir)
        lines.append(count)
    pairs = [r.seen for r in reservoirs]
    sample = []
    for index, (reservoir, share) in enumerate(
        zip(reservoirs, mixing_shares(corpora, pairs), strict=True)
    ):
        wanted = min(round(sample_size * share), len(reservoir.items))
        keep = np.random.default_rng([seed, index, 1]).choice(
            len(reservoir.items), wanted, replace=False
        )
        sample += [reservoir.items[i] for i in sorted(keep)]
    return {"lines": lines, "pairs": pairs, "sample": sample}
