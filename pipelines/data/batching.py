"""tf.data transforms from sentence pairs to token-budget batches for `model.fit`.

Each factory returns a function for `dataset.apply`. The full path is
`make_dataset`: tokenize in-graph, add BOS/EOS, filter by length, cache,
shuffle, group by (source, target) length bucket into batches of about
`batch_tokens` tokens, and emit `((source_ids, target_input_ids),
target_output_ids)` (section 5.1: batches of about 25,000 source and 25,000
target tokens).
"""

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from pipelines.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

AUTOTUNE = tf.data.AUTOTUNE


def bucket_bounds(max_length, ratio=1.1, min_bucket=8):
    """Upper length bounds of the length buckets, spaced by about `ratio`.

    Args:
        max_length: int, the longest sequence kept.
        ratio: float, growth from one bound to the next (>1).
        min_bucket: int, all lengths up to this share the first bucket.

    Returns:
        list of int, ascending, the last equal to `max_length`.
    """
    bounds, bound = [], min(min_bucket, max_length)
    while bound < max_length:
        bounds.append(bound)
        bound = max(bound + 1, int(bound * ratio))
    return bounds + [max_length]


def tokenize_pairs(tokenizer, chunk_size=1024):
    """Maps string pairs to id sequences: `source + [EOS]`, `[BOS] + target + [EOS]`.

    Tokenizes `chunk_size` sentences per call, which is far faster than one.

    Args:
        tokenizer: a tensorflow-text tokenizer with `tokenize(strings)`.
        chunk_size: int, sentences per tokenizer call.

    Returns:
        function for `dataset.apply`: scalar string pairs -> dicts of int32
        `source` `(S,)` and `target` `(T + 1,)` vectors.
    """

    def encode(sources, targets):
        source = tokenizer.tokenize(sources)  # ragged (n, S)
        target = tokenizer.tokenize(targets)  # ragged (n, T)
        n = tf.shape(sources)[0]
        bos = tf.fill([n, 1], BOS_ID)
        eos = tf.fill([n, 1], EOS_ID)
        return {
            "source": tf.concat([source, eos], axis=1),
            "target": tf.concat([bos, target, eos], axis=1),
        }

    def apply(dataset):
        return (
            dataset.batch(chunk_size)
            .map(encode, num_parallel_calls=AUTOTUNE, deterministic=True)
            .unbatch()
            .map(_dense, num_parallel_calls=AUTOTUNE, deterministic=True)
        )

    return apply


def _dense(example):
    # Unbatching ragged ids gives ragged vectors; padded_batch needs dense ones.
    return {name: tf.convert_to_tensor(ids) for name, ids in example.items()}


def _lengths(example):
    # Target length as the model sees it: target_input_ids drops the last id.
    return tf.size(example["source"]), tf.size(example["target"]) - 1


def filter_by_length(max_length):
    """Drops pairs whose source or target input is longer than `max_length`.

    Returns:
        function for `dataset.apply` on `tokenize_pairs` output.
    """

    def keep(example):
        source_length, target_length = _lengths(example)
        return tf.logical_and(source_length <= max_length, target_length <= max_length)

    return lambda dataset: dataset.filter(keep)


def bucket_by_token_budget(
    batch_tokens, max_length, ratio=1.1, fixed_shapes=False, row_multiple=1, pad_id=PAD_ID
):
    """Groups examples of similar source and target length into token-budget batches.

    Examples are keyed by the pair (source length bucket, target length
    bucket), so each side pads only to its own bucket bound. A batch holds at
    most `batch_tokens // max(source bound, target bound)` examples, so neither
    side of a padded batch exceeds `batch_tokens` tokens. Partly filled groups
    are emitted at the end of the input, so no example is lost.

    With `fixed_shapes`, for compilers that build one program per input shape
    (XLA under JAX), examples are keyed by the longer side's bucket alone and
    every batch of a bucket has one shape: both sides padded to the bucket's
    bound, and all-padding rows added up to the bucket's batch size, a
    multiple of `row_multiple` (the devices a batch is split over). Padding
    rows hold no real token, so token-exact losses ignore them. The shapes
    are then as many as the buckets. A batch holds at least `row_multiple`
    rows, so a bucket whose bound times `row_multiple` exceeds
    `batch_tokens` gives batches above the budget.

    Args:
        batch_tokens: int, token budget of one side of a padded batch.
        max_length: int, the longest sequence (see `filter_by_length`).
        ratio: float, spacing of the bucket bounds.
        fixed_shapes: bool, one batch shape per bucket (see above).
        row_multiple: int, with `fixed_shapes`, batch sizes are multiples of it.
        pad_id: int, the padding id (the vocabulary's).

    Returns:
        function for `dataset.apply`: examples -> padded batches, dicts of int32
        `source` `(B, S)` and `target` `(B, T + 1)`.
    """
    bounds = bucket_bounds(max_length, ratio)
    if batch_tokens < max_length:
        raise ValueError(
            f"batch_tokens must be at least max_length ({max_length}). "
            f"Received: batch_tokens={batch_tokens}"
        )
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be positive. Received: row_multiple={row_multiple}")
    n = len(bounds)
    bounds_tensor = tf.constant(bounds, tf.int32)
    if fixed_shapes:
        sizes = [max(batch_tokens // bound // row_multiple, 1) * row_multiple for bound in bounds]
    else:
        sizes = [batch_tokens // max(bounds[i], bounds[j]) for i in range(n) for j in range(n)]
    sizes_tensor = tf.constant(sizes, tf.int64)

    def key(example):
        source_length, target_length = _lengths(example)
        i = tf.searchsorted(bounds_tensor, [source_length], side="left")[0]
        j = tf.searchsorted(bounds_tensor, [target_length], side="left")[0]
        return tf.cast(tf.maximum(i, j) if fixed_shapes else i * n + j, tf.int64)

    def batch_size_of(bucket):
        return tf.gather(sizes_tensor, bucket)

    def batch(bucket, window):
        size = batch_size_of(bucket)
        shapes = {"source": [None], "target": [None]}  # the window's longest
        if fixed_shapes:
            bound = tf.cast(tf.gather(bounds_tensor, bucket), tf.int64)
            shapes = {"source": [bound], "target": [bound + 1]}
        batches = window.padded_batch(size, padded_shapes=shapes, padding_values=pad_id)

        def fill_rows(padded):
            missing = size - tf.cast(tf.shape(padded["source"])[0], tf.int64)
            return {
                name: tf.pad(ids, [[0, missing], [0, 0]], constant_values=pad_id)
                for name, ids in padded.items()
            }

        return batches.map(fill_rows) if fixed_shapes else batches

    return lambda dataset: dataset.group_by_window(
        key_func=key, reduce_func=batch, window_size_func=batch_size_of
    )


def to_model_inputs():
    """Splits padded batches into `((source_ids, target_input_ids), target_output_ids)`."""

    def split(batch):
        target = batch["target"]
        return (batch["source"], target[:, :-1]), target[:, 1:]

    return lambda dataset: dataset.map(split, num_parallel_calls=AUTOTUNE)


def make_dataset(pairs, tokenizer, batch_tokens=4096, max_length=128, **options):
    """The input pipeline from sentence pairs to batches ready for `model.fit`.

    Args:
        pairs: list of `(source, target)` str pairs, or a `tf.data.Dataset` of
            scalar string pairs (e.g. from `corpus.load_tfds`).
        tokenizer: tensorflow-text tokenizer (`tokenizer.load_tokenizer`).
        batch_tokens: int, about this many tokens per side of each batch.
        max_length: int, longer pairs are dropped.
        **options: `shuffle`, `repeat`, `seed`, `shuffle_buffer` and `cache`,
            as in `batch_examples`.

    Returns:
        `tf.data.Dataset` of `((source_ids (B, S), target_input_ids (B, T)),
        target_output_ids (B, T))`, int32, padded with 0.
    """
    examples = tokenize_examples(pairs, tokenizer, max_length)
    return batch_examples(examples, batch_tokens, max_length, **options)


def tokenize_examples(pairs, tokenizer, max_length):
    """The tokenizing half of `make_dataset`: pairs -> id examples within `max_length`.

    Args:
        pairs: list of `(source, target)` str pairs, or a `tf.data.Dataset` of
            scalar string pairs.
        tokenizer: tensorflow-text tokenizer.
        max_length: int, longer pairs are dropped.

    Returns:
        `tf.data.Dataset` of dicts of int32 `source` `(S,)` and `target`
        `(T + 1,)` vectors (see `tokenize_pairs`).
    """
    if not isinstance(pairs, tf.data.Dataset):
        sources = [source for source, _ in pairs]
        targets = [target for _, target in pairs]
        pairs = tf.data.Dataset.from_tensor_slices((sources, targets))
    return pairs.apply(tokenize_pairs(tokenizer)).apply(filter_by_length(max_length))


def sampled_examples(pairs, model_path, max_length, alpha, copies=1, seed=0, chunk_size=4096):
    """`tokenize_examples` with BPE-dropout: `copies` sampled segmentations of every pair.

    Subword regularization: while segmenting, each BPE merge is skipped with
    probability `alpha`, so the model sees one word split in several ways
    (both sides, as in Provilkov et al., 2020). Copy `k` of the corpus is
    sampled with seeds drawn from `(seed, k)`; copies follow one another and
    the training shuffle mixes them. With `alpha=0` every copy equals
    `tokenize_examples`.

    The sampling runs in sentencepiece's Python binding, one thread, not in
    the graph: tensorflow-text's sampling tokenizer takes no seed, and one
    thread makes the samples reproducible. For pairs in memory (studies,
    benchmarks); `kt train` samples its copies while preparing its shards
    (`pipelines.data.preparation`).

    Args:
        pairs: list of `(source, target)` str pairs, or a `tf.data.Dataset` of
            scalar string pairs.
        model_path: str, the SentencePiece `.model` file (a BPE model).
        max_length: int, longer sampled pairs are dropped.
        alpha: float in [0, 1), the probability of skipping a merge.
        copies: int, sampled segmentations of the corpus.
        seed: int, sampling seed.
        chunk_size: int, sentences segmented per call.

    Returns:
        `tf.data.Dataset` of dicts of int32 `source` `(S,)` and `target`
        `(T + 1,)` vectors, as `tokenize_examples`.

    References:
        Provilkov et al., 2020, "BPE-Dropout: Simple and Effective Subword
        Regularization".
    """
    processor = spm.SentencePieceProcessor(model_file=model_path)

    def segment(sentences, sentences_seed):
        # One thread and a seed per call: sentencepiece's sampler restarts
        # from the global seed at every call.
        spm.set_random_generator_seed(int(sentences_seed))
        return processor.encode(
            sentences, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1
        )

    def chunks():
        rows = pairs
        if isinstance(pairs, tf.data.Dataset):
            rows = ((s.decode(), t.decode()) for s, t in pairs.as_numpy_iterator())
        chunk = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == chunk_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def generate():
        for copy in range(copies):
            for index, chunk in enumerate(chunks()):
                seeds = np.random.SeedSequence([seed, copy, index]).generate_state(2)
                source_seed, target_seed = seeds
                sources = segment([source for source, _ in chunk], source_seed)
                targets = segment([target for _, target in chunk], target_seed)
                for source, target in zip(sources, targets, strict=True):
                    yield {
                        "source": np.array(source + [EOS_ID], np.int32),
                        "target": np.array([BOS_ID] + target + [EOS_ID], np.int32),
                    }

    vector = tf.TensorSpec([None], tf.int32)
    examples = tf.data.Dataset.from_generator(
        generate, output_signature={"source": vector, "target": vector}
    )
    return examples.apply(filter_by_length(max_length))


def batch_examples(
    examples,
    batch_tokens=4096,
    max_length=128,
    shuffle=True,
    repeat=False,
    seed=0,
    shuffle_buffer=100_000,
    cache=True,
    fixed_shapes=False,
    row_multiple=1,
    ratio=1.1,
    pad_id=PAD_ID,
):
    """The batching half of `make_dataset`, for already tokenized examples.

    Args:
        examples: `tf.data.Dataset` of dicts of int32 `source` and `target`
            vectors, as `tokenize_examples` or `shards.read_examples` return
            them.
        batch_tokens: int, about this many tokens per side of each batch.
        max_length: int, longer examples are dropped; the bucket bounds reach it.
        shuffle: bool, shuffle examples and batches (each epoch anew).
        repeat: bool, repeat forever (shuffled anew each pass).
        seed: int, shuffling seed.
        shuffle_buffer: int, examples in the shuffle buffer.
        cache: bool, keep tokenized examples in memory after the first pass.
        fixed_shapes: bool, one batch shape per length bucket, for JAX (see
            `bucket_by_token_budget`).
        row_multiple: int, with `fixed_shapes`, batch sizes are multiples of
            it (the devices a batch is split over).
        ratio: float, spacing of the length buckets' bounds.
        pad_id: int, the padding id (`shards.special_ids` of prepared examples).

    Returns:
        `tf.data.Dataset` as in `make_dataset`.
    """
    examples = examples.apply(filter_by_length(max_length))
    if cache:
        examples = examples.cache()
    if shuffle:
        examples = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        examples = examples.repeat()
    batches = examples.apply(
        bucket_by_token_budget(
            batch_tokens, max_length, ratio, fixed_shapes, row_multiple, pad_id=pad_id
        )
    )
    if shuffle:
        batches = batches.shuffle(256, seed=seed + 1, reshuffle_each_iteration=True)
    return batches.apply(to_model_inputs()).prefetch(AUTOTUNE)


def padding_efficiency(dataset, max_batches=None):
    """Real tokens over all tokens (padding included) in a batched dataset.

    Args:
        dataset: `make_dataset` output.
        max_batches: int or None, stop after this many batches.

    Returns:
        dict with `efficiency`, `real_tokens`, `padded_tokens`, `batches`,
        `examples`, and `max_batch_tokens` (the largest side of any batch).
    """
    real = padded = batches = examples = largest = 0
    # Real target tokens are counted on the labels: the decoder inputs of a
    # padded batch keep the EOS of every target but the longest.
    for (source, _), labels in dataset.take(max_batches or -1):
        source, labels = source.numpy(), labels.numpy()
        real += int(np.sum(source != PAD_ID) + np.sum(labels != PAD_ID))
        padded += source.size + labels.size
        largest = max(largest, source.size, labels.size)
        batches += 1
        examples += source.shape[0]
    return {
        "efficiency": real / max(padded, 1),
        "real_tokens": real,
        "padded_tokens": padded,
        "batches": batches,
        "examples": examples,
        "max_batch_tokens": largest,
    }
