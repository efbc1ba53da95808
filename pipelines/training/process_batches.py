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
bucket, so memory stays bounded, and logs how many it dropped.
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
    (sources, inputs), outputs = zip(*[((s, i), o) for (s, i), o in batches], strict=True)
    join = np.concatenate
    return (join(sources), join(inputs)), join(outputs)


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
        gather: callable from this process's pending counts, int `(k, n)`
            for its `k` pipelines and `n` buckets, to every pipeline's, `(P, n)`
            in pipeline order (`process_allgather`); None: this process runs
            every pipeline.
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
        streams = self.make_streams()
        pending = [collections.defaultdict(collections.deque) for _ in streams]
        buckets = len(self.bounds)
        dropped = 0
        while True:
            for queues in pending:
                while sum(len(q) for q in queues.values()) > self.max_pending:
                    fullest = max(queues, key=lambda b: len(queues[b]))
                    queues[fullest].popleft()
                    dropped += 1
                    logger.warning("%d local batches dropped waiting for other processes", dropped)
            counts = np.array([[len(q[b]) for b in range(buckets)] for q in pending], np.int32)
            common = np.asarray(self.gather(counts)).reshape(-1, buckets).min(axis=0)
            if common.max() > 0:
                bucket = int(np.argmax(common))  # the first of the largest: the shortest on a tie
                yield _concatenate([queues[bucket].popleft() for queues in pending])
                continue
            for stream, queues in zip(streams, pending, strict=True):
                batch = next(stream, None)
                if batch is None:  # a finite stream (training streams repeat)
                    return
                queues[_bucket(batch, self.bounds)].append(batch)
