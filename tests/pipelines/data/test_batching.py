import collections

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from pipelines.data.batching import (
    bucket_bounds,
    make_dataset,
    padding_efficiency,
    sampled_examples,
    tokenize_examples,
)
from pipelines.data.corpus import load_multi30k
from pipelines.data.default_corpus import generate_pairs
from pipelines.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizer, train_sentencepiece


def rows(batch_ids):
    """Rows of a padded batch without their padding, as tuples."""
    return [tuple(int(i) for i in row if i != PAD_ID) for row in batch_ids]


def check_epoch(dataset, pairs, processor, batch_tokens, max_length):
    expected = collections.Counter()
    for source, target in pairs:
        s, t = processor.encode(source) + [EOS_ID], [BOS_ID] + processor.encode(target) + [EOS_ID]
        if len(s) <= max_length and len(t) - 1 <= max_length:
            expected[(tuple(s), tuple(t))] += 1
    seen = collections.Counter()
    for (source, target_input), target_output in dataset:
        source, target_input, target_output = (
            x.numpy() for x in (source, target_input, target_output)
        )
        assert source.size <= batch_tokens and target_input.size <= batch_tokens
        assert target_input.shape == target_output.shape
        # target_input is [BOS] + target; target_output is target + [EOS].
        np.testing.assert_array_equal(target_input[:, 1:], target_output[:, :-1])
        assert np.all(target_input[:, 0] == BOS_ID)
        for s, to in zip(rows(source), rows(target_output), strict=True):
            assert to[-1] == EOS_ID
            seen[(s, (BOS_ID,) + to)] += 1
    return expected, seen


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory, request):
    folder = request.getfixturevalue("multi30k_dir")
    pairs = load_multi30k(folder, "train")
    path = str(tmp_path_factory.mktemp("spm") / "m30k.model")
    train_sentencepiece([s for pair in pairs for s in pair], path, vocabulary_size=8000)
    return pairs, path


@pytest.fixture(scope="module")
def multi30k_dir():
    from tests.pipelines.conftest import shared_data

    return shared_data("multi30k")


def test_bucket_bounds():
    bounds = bucket_bounds(100)
    assert bounds[0] == 8 and bounds[-1] == 100
    assert all(b > a for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(b <= max(a + 1, int(a * 1.1)) for a, b in zip(bounds, bounds[1:], strict=False))


def test_multi30k_epoch_is_exact_within_budget_and_dense(multi30k):
    pairs, path = multi30k
    batch_tokens, max_length = 4096, 64
    dataset = make_dataset(
        pairs, load_tokenizer(path), batch_tokens, max_length, shuffle=True, seed=1
    )
    processor = spm.SentencePieceProcessor(model_file=path)
    expected, seen = check_epoch(dataset, pairs, processor, batch_tokens, max_length)
    assert seen == expected  # every kept example exactly once
    assert sum(expected.values()) > 28900  # the length filter drops only outliers
    stats = padding_efficiency(dataset)
    print("Multi30k padding efficiency", stats)
    assert stats["efficiency"] > 0.85
    assert stats["max_batch_tokens"] <= batch_tokens


def test_filter_and_small_budgets(tmp_path):
    pairs = [("a " * n, "b " * m) for n in range(1, 30) for m in range(1, 30, 3)]
    path = train_sentencepiece(
        [s for pair in pairs for s in pair], str(tmp_path / "s.model"), vocabulary_size=8
    )
    processor = spm.SentencePieceProcessor(model_file=path)
    for batch_tokens in (20, 64):
        dataset = make_dataset(pairs, load_tokenizer(path), batch_tokens, max_length=20)
        expected, seen = check_epoch(dataset, pairs, processor, batch_tokens, 20)
        assert seen == expected and 0 < sum(expected.values()) < len(pairs)
    with pytest.raises(ValueError, match="batch_tokens must be at least max_length"):
        make_dataset(pairs, load_tokenizer(path), batch_tokens=10, max_length=20)


def test_repeated_training_data_fills_batches(multi30k):
    pairs, path = multi30k
    dataset = make_dataset(pairs[:5000], load_tokenizer(path), 2048, 64, repeat=True)
    stats = padding_efficiency(dataset, max_batches=100)
    fill = stats["padded_tokens"] / 2 / stats["batches"] / 2048
    assert fill > 0.8, stats
    assert isinstance(dataset, tf.data.Dataset)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    pairs = generate_pairs(400, seed=0)
    path = str(tmp_path_factory.mktemp("spm") / "small.model")
    train_sentencepiece([s for pair in pairs for s in pair], path, vocabulary_size=300)
    return pairs, path


def examples_of(dataset):
    return [(tuple(e["source"]), tuple(e["target"])) for e in dataset.as_numpy_iterator()]


def test_bpe_dropout_samples_other_segmentations_of_the_same_text(small):
    pairs, path = small
    processor = spm.SentencePieceProcessor(model_file=path)
    plain = examples_of(tokenize_examples(pairs, load_tokenizer(path), 200))
    assert len(plain) == len(pairs)
    # With no dropout every copy is the in-graph tokenizer's segmentation.
    assert examples_of(sampled_examples(pairs, path, 200, alpha=0.0, copies=2)) == plain * 2
    sampled = examples_of(sampled_examples(pairs, path, 200, alpha=0.3, copies=2, seed=1))
    first, second = sampled[: len(pairs)], sampled[len(pairs) :]
    assert len(second) == len(pairs)
    text = lambda ids: processor.decode([int(i) for i in ids])  # noqa: E731
    for copy in (first, second):
        changed = 0
        for (source, target), (plain_source, plain_target) in zip(copy, plain, strict=True):
            assert source[-1] == EOS_ID and (target[0], target[-1]) == (BOS_ID, EOS_ID)
            assert text(source[:-1]) == text(plain_source[:-1])
            assert text(target[1:-1]) == text(plain_target[1:-1])
            changed += (source, target) != (plain_source, plain_target)
            # Dropped merges leave smaller pieces: never fewer of them.
            assert len(source) >= len(plain_source) and len(target) >= len(plain_target)
        assert changed > len(pairs) // 4
    assert first != second  # each copy is sampled anew
    # Seeded: the same seed gives the same samples, from a list or a tf.data input.
    dataset = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))
    assert examples_of(sampled_examples(dataset, path, 200, 0.3, copies=2, seed=1)) == sampled
    assert examples_of(sampled_examples(pairs, path, 200, 0.3, copies=2, seed=2)) != sampled
    # More dropout, more pieces; the length filter applies to the sampled lengths.
    pieces = lambda examples: sum(len(s) + len(t) for s, t in examples)  # noqa: E731
    lighter = examples_of(sampled_examples(pairs, path, 200, 0.1, copies=2, seed=1))
    assert pieces(plain) * 2 < pieces(lighter) < pieces(sampled)
    short = examples_of(sampled_examples(pairs, path, 12, 0.3, copies=2, seed=1))
    assert short == [(s, t) for s, t in sampled if len(s) <= 12 and len(t) - 1 <= 12]
    assert 0 < len(short) < len(sampled)


def test_fixed_shapes_give_one_shape_per_bucket_and_rows_that_split(tmp_path):
    pairs = [("a " * n, "b " * m) for n in range(1, 30) for m in range(1, 30, 3)]
    path = train_sentencepiece(
        [s for pair in pairs for s in pair], str(tmp_path / "s.model"), vocabulary_size=8
    )
    processor = spm.SentencePieceProcessor(model_file=path)
    options = {"fixed_shapes": True, "row_multiple": 3, "ratio": 1.25}
    dataset = make_dataset(pairs, load_tokenizer(path), 64, 20, shuffle=True, **options)
    kept = []  # the batches without their all-padding rows
    shapes = collections.defaultdict(set)
    for (source, target_input), target_output in dataset.as_numpy_iterator():
        # Both sides padded to one bucket's bound; rows a multiple of 3.
        assert source.shape[1] == target_input.shape[1] == target_output.shape[1]
        assert source.shape[0] % 3 == 0 and source.size <= 64
        shapes[source.shape[1]].add(source.shape)
        real = np.any(source != PAD_ID, axis=1)
        assert np.all(target_input[~real] == PAD_ID) and np.all(target_output[~real] == PAD_ID)
        assert np.all(np.any(target_output[real] != PAD_ID, axis=1))
        kept.append(
            tf.nest.map_structure(
                tf.constant, ((source[real], target_input[real]), target_output[real])
            )
        )
    assert set(shapes) <= set(bucket_bounds(20, 1.25))
    assert all(len(found) == 1 for found in shapes.values())  # one shape a bucket
    expected, seen = check_epoch(kept, pairs, processor, 64, 20)
    assert seen == expected and sum(expected.values()) > 0
