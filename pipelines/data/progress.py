"""Progress of a long pass over a corpus, as lines a log file holds."""

import logging
import time

logger = logging.getLogger(__name__)

# Seconds between two progress lines of a long pass.
PROGRESS_SECONDS = 30.0


class Progress:
    """Progress lines for a log file: done, rate and time left, every `PROGRESS_SECONDS`.

    Args:
        what: str, what is counted, e.g. "Tokenizing corpus.en / corpus.de".
        total: int or None, the count at the end (None: unknown, no time left).
        unit: str, what one count is ("lines", "pairs").
        clock: callable returning seconds.
    """

    def __init__(self, what, total=None, unit="pairs", clock=time.monotonic):
        self.what, self.total, self.unit, self.clock = what, total, unit, clock
        self.started = self.last = clock()
        self.done = 0

    def update(self, count):
        """Adds `count` to the work done; logs a line if the last one is old enough."""
        self.done += count
        now = self.clock()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            logger.info("%s", self.line())

    def line(self):
        """`what: done[/total] unit, rate unit/s[, about Ns left]`."""
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        total = f"/{self.total:,}" if self.total else ""
        text = f"{self.what}: {self.done:,}{total} {self.unit}, {rate:,.0f} {self.unit}/s"
        if self.total and rate > 0:
            text += f", about {max(self.total - self.done, 0) / rate:,.0f} s left"
        return text
