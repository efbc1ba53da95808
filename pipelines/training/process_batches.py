"""Global batches of a JAX run whose processes each read their own shards.

On JAX every batch comes in one shape per length bucket (XLA compiles the
step once per shape), so a step's global batch needs one local batch of the
same bucket from every process. Each process batches its own shards
(`shards.read_examples(pipeline=...)`) and keeps the local batches it has
read per bucket; every round the processes share how many each holds of
each bucket (one small all-gather), and the step takes the bucket that all
of them hold, the one held most where several are, the shortest on a tie.
Where none is held by all, each reads one more batch. The choice depends
only on what every process holds, so all choose alike, and the global batch
is the processes' local batches one after another, by process index.

A bucket that one process meets far more often than another (a rare length
whose few examples fell in one process's shards) waits in its queue; past
`max_pending` batches a process drops its oldest batch of its fullest
bucket, so memory stays bounded, and logs how many it dropped. A process
whose stream ends says so in the same all-gather, and every process stops
there, none left waiting in a collective.
"""

import collections
import logging

import numpy as np

logger = logging.getLogger(__name__)


def _bucket(batch, bounds):
    (source_ids, _), _ = batch
    return bounds.index(source_ids.shape[1])


def _concatenate(batches):
    """One batch of the rows of several, in order: `((source, target_input), target_output)`."""
    sources = np.concatenate([source for (source, _), _ in batches])
    inputs = np.concatenate([target_input for (_, target_input), _ in batches])
    return (sources, inputs), np.concatenate([target_output for _, target_output in batches])


class ProcessBatches:
    """Iterates the local batches of a step, agreed on with the other processes.

    Args:
        make_streams: callable returning a list of iterators over local
            batches (NumPy `((source_ids (B, S), target_input_ids (B, T)),
            target_output_ids (B, T))`, fixed shapes per bucket), one per
            input pipeline this process runs: its own, or every pipeline's
            when one process stands for all (tests, a reference run).
        bounds: list of int, the buckets' length bounds (a batch's source
            length is one of them).
        gather: callable from this process's rows, int `(k, n + 1)` for its
            `k` pipelines (the pending batches of each of `n` buckets, then 1
            where the pipeline's stream has ended), to every pipeline's,
            `(P, n + 1)` in pipeline order (`process_allgather`); None: this
            process runs every pipeline.
        max_pending: int, local batches a pipeline may hold before it drops.

    Yields:
        the rows of this process's pipelines for one step, their batches
        concatenated in pipeline order (a whole global batch when `gather`
        is None).
    """

    # Placed as this process's rows of a global batch (`JaxTrainer`).
    process_local = True

    def __init__(self, make_streams, bounds, gather=None, max_pending=256):
        self.make_streams = make_streams
        self.bounds = list(bounds)
        self.gather = gather or (lambda counts: counts)
        self.max_pending = max_pending

    def __iter__(self):
        return ProcessStream(self)


class ProcessStream:
    """An iterator over `ProcessBatches`' steps whose position a backup can save.

    Its state is each pipeline's tf.data position (`streams.TensorStream`)
    and the local batches it holds, waiting for the other processes.
    """

    def __init__(self, batches):
        self.batches = batches
        self.streams = batches.make_streams()
        self.pending = [collections.defaultdict(collections.deque) for _ in self.streams]
        self.ended = [False] * len(self.streams)
        self.dropped = 0

    def __iter__(self):
        return self

    def _drop_beyond_bound(self):
        for queues in self.pending:
            while sum(len(q) for q in queues.values()) > self.batches.max_pending:
                fullest = max(queues, key=lambda b: len(queues[b]))
                queues[fullest].popleft()
                self.dropped += 1
                if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, 8, ...: now and then
                    logger.warning("%d local batches dropped waiting for others", self.dropped)

    def __next__(self):
        buckets = len(self.batches.bounds)
        while True:
            self._drop_beyond_bound()
            rows = [
                [len(q[b]) for b in range(buckets)] + [end]
                for q, end in zip(self.pending, self.ended, strict=True)
            ]
            gathered = self.batches.gather(np.array(rows, np.int32))
            gathered = np.asarray(gathered).reshape(-1, buckets + 1)
            if gathered[:, -1].any():  # a stream has ended (training streams repeat)
                raise StopIteration
            common = gathered[:, :-1].min(axis=0)
            if common.max() > 0:
                bucket = int(np.argmax(common))  # the first of the largest: the shortest on a tie
                return _concatenate([queues[bucket].popleft() for queues in self.pending])
            for i, (stream, queues) in enumerate(zip(self.streams, self.pending, strict=True)):
                batch = next(stream, None)
                if batch is None:
                    self.ended[i] = True
                else:
                    queues[_bucket(batch, self.batches.bounds)].append(batch)

    def save(self, prefix):
        """Writes every pipeline's position and the held batches under `prefix`."""
        arrays = {"ended": np.array(self.ended), "dropped": np.array(self.dropped)}
        for i, (stream, queues) in enumerate(zip(self.streams, self.pending, strict=True)):
            stream.save(f"{prefix}-pipeline-{i}")
            for bucket, queue in queues.items():
                for k, ((source, target_input), target_output) in enumerate(queue):
                    arrays[f"{i}/{bucket}/{k}/s"] = source
                    arrays[f"{i}/{bucket}/{k}/i"] = target_input
                    arrays[f"{i}/{bucket}/{k}/o"] = target_output
        with open(f"{prefix}-pending.npz", "wb") as handle:
            np.savez(handle, **arrays)

    def restore(self, prefix):
        """Moves every pipeline to the position saved under `prefix`, with its held batches."""
        for i, stream in enumerate(self.streams):
            stream.restore(f"{prefix}-pipeline-{i}")
        with np.load(f"{prefix}-pending.npz") as saved:
            self.ended = [bool(x) for x in saved["ended"]]
            self.dropped = int(saved["dropped"])
            held = collections.defaultdict(dict)
            for key in saved.files:
                if key.count("/") == 3:
                    i, bucket, k, name = key.split("/")
                    held[(int(i), int(bucket), int(k))][name] = saved[key]
        self.pending = [collections.defaultdict(collections.deque) for _ in self.streams]
        for (i, bucket, _), parts in sorted(held.items()):
            batch = (parts["s"], parts["i"]), parts["o"]
            self.pending[i][bucket].append(batch)

    def skip(self, count):
        """Reads past `count` steps (a position older backups did not save)."""
        for _ in range(count):
            next(self)
