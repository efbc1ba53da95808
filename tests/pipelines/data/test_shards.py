"""The streaming data path: scan, vocabulary sample, shards in random order, read per worker."""

import collections
import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from pipelines.data import preparation, scan, shards
from pipelines.data.batching import batch_examples, tokenize_examples
from pipelines.data.corpus import files_corpus, iter_parallel_lines, pairs_corpus
from pipelines.data.default_corpus import generate_pairs
from pipelines.data.progress import Progress
from pipelines.data.tokenizer import load_tokenizer, train_sentencepiece
from pipelines.errors import DataError


def write_lines(path, lines, compress=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    pairs = generate_pairs(2000, seed=3)
    path = str(tmp_path_factory.mktemp("spm") / "spm.model")
    train_sentencepiece([s for pair in pairs for s in pair], path, vocabulary_size=300)
    return path


def make_plan(corpora, seed=0, shard_size=200, min_shards=1, copies=1, identity=None):
    found = scan.scan(corpora, 100, seed)
    return {
        "identity": identity or {"test": 1},
        "lines": found["lines"],
        "pairs": found["pairs"],
        "shares": scan.mixing_shares(corpora, found["pairs"]),
        "shards": preparation.plan_shards(found["pairs"], copies, shard_size, min_shards),
        "seed": seed,
        "copies": copies,
        "dtype": "uint16",
    }


def examples_of(dataset):
    return [(tuple(e["source"].tolist()), tuple(e["target"].tolist())) for e in dataset]


def shard_bytes(folder):
    return {
        name: open(os.path.join(folder, name), "rb").read()
        for name in sorted(os.listdir(folder))
        if name.startswith("shard-")
    }


def test_the_reader_streams_and_finds_a_bad_line_only_when_it_gets_there(tmp_path):
    source = tmp_path / "bad.en"
    source.write_bytes(b"one\ntwo\nthree \xff\nfour\n")
    target = write_lines(tmp_path / "ok.de.gz", ["eins", "zwei", "drei", "vier"], compress=True)
    lines = iter_parallel_lines(str(source), target)
    # Two pairs come out before the third line is read: nothing is read ahead of the consumer.
    assert [next(lines), next(lines)] == [("one", "eins"), ("two", "zwei")]
    with pytest.raises(DataError, match=r"bad\.en, line 3: not valid UTF-8"):
        next(lines)


def test_the_scan_checks_counts_and_drops_empty_pairs(tmp_path, caplog):
    source = write_lines(tmp_path / "a.en", ["a", " ", "c", "d"])
    target = write_lines(tmp_path / "a.de.gz", ["x", "y", "", "w"], compress=True)
    found = scan.scan([files_corpus(source, target)], 10, seed=0)
    assert (found["lines"], found["pairs"]) == ([4], [2])
    assert found["sample"] == [("a", "x"), ("d", "w")]  # all of a small corpus, in order
    assert "Dropped 2 of 4 pairs" in caplog.text
    short = write_lines(tmp_path / "b.de", ["x"])
    with pytest.raises(DataError, match=r"a\.en has 4 lines, .*b\.de has 1 lines"):
        scan.scan([files_corpus(source, short)], 10, seed=0)
    empty = write_lines(tmp_path / "empty", ["", " "])
    with pytest.raises(DataError, match="empty"):
        scan.scan([files_corpus(empty, empty)], 10, seed=0)


def test_the_reservoir_is_uniform_and_seeded():
    counts = collections.Counter()
    for seed in range(4000):
        reservoir = scan.Reservoir(5, np.random.default_rng(seed))
        for item in range(50):
            reservoir.add(item)
        assert len(set(reservoir.items)) == 5
        counts.update(reservoir.items)
    # Each of 50 items is kept 4000 * 5 / 50 = 400 times in expectation (sd about 19).
    assert set(counts) == set(range(50))
    assert 320 < min(counts.values()) and max(counts.values()) < 480
    chi_square = sum((c - 400) ** 2 / 400 for c in counts.values())
    assert chi_square < 90  # 49 degrees of freedom: p < 0.001 above 85.4


def test_the_vocabulary_sample_follows_the_shares_of_the_stream():
    big = pairs_corpus("big", [(f"b{i}", f"B{i}") for i in range(3000)])
    small = pairs_corpus("small", [(f"s{i}", f"S{i}") for i in range(1000)])
    found = scan.scan([big, small], 400, seed=1)
    origins = collections.Counter(source[0] for source, _ in found["sample"])
    assert origins == {"b": 300, "s": 100}  # in proportion to size by default
    big.weight, small.weight = 1.0, 3.0
    weighted = scan.scan([big, small], 400, seed=1)
    assert collections.Counter(s[0] for s, _ in weighted["sample"]) == {"b": 100, "s": 300}
    assert scan.scan([big, small], 400, seed=1)["sample"] == weighted["sample"]
    assert scan.scan([big, small], 400, seed=2)["sample"] != weighted["sample"]


def test_records_decode_to_the_examples_the_in_graph_tokenizer_makes(tmp_path, vocabulary):
    pairs = generate_pairs(700, seed=5)
    corpora = [pairs_corpus("pairs", pairs)]
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, make_plan(corpora))
    assert [len(c["shards"]) for c in manifest["corpora"]] == [4]  # 700 pairs / 200 a shard
    assert sum(s["records"] for s in manifest["corpora"][0]["shards"]) == 700
    tokenized = tokenize_examples(pairs, load_tokenizer(vocabulary), 10_000)
    expected = examples_of(tokenized.as_numpy_iterator())
    read = examples_of(shards.read_examples(manifest, str(tmp_path)).as_numpy_iterator())
    assert sorted(read) == sorted(expected)
    assert read != expected  # the shards hold them in another order
    assert not os.path.exists(tmp_path / "parts")


def test_a_killed_preparation_resumes_to_the_same_shards(tmp_path, vocabulary, monkeypatch):
    pairs = generate_pairs(900, seed=6)
    source = write_lines(tmp_path / "c.en", [s for s, _ in pairs])
    target = write_lines(tmp_path / "c.de", [t for _, t in pairs])
    corpora = [files_corpus(source, target)]
    monkeypatch.setattr(preparation, "PART_LINES", 250)  # four parts
    plan = make_plan(corpora)
    clean = tmp_path / "clean"
    preparation.prepare_shards(corpora, str(clean), vocabulary, plan)

    killed, write_part, written = tmp_path / "killed", preparation._write_part, []

    def dies_on_the_third_part(*args):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(args[3])
        write_part(*args)

    monkeypatch.setattr(preparation, "_write_part", dies_on_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        preparation.prepare_shards(corpora, str(killed), vocabulary, plan)
    assert shards.read_manifest(str(killed)) is None  # never trained on
    done = sorted((killed / "parts").glob("*/done.json"))
    assert len(done) == 2
    times = [p.stat().st_mtime_ns for p in done]

    written.clear()
    monkeypatch.setattr(
        preparation, "_write_part", lambda *a: (written.append(a[3]), write_part(*a))
    )
    write_shard, shuffled = preparation._write_shard, []

    def dies_after_one_shard(*args):
        if shuffled:
            raise KeyboardInterrupt
        shuffled.append(args[2])
        return write_shard(*args)

    monkeypatch.setattr(preparation, "_write_shard", dies_after_one_shard)
    with pytest.raises(KeyboardInterrupt):
        preparation.prepare_shards(corpora, str(killed), vocabulary, plan)
    assert written == [2, 3]  # only the parts not complete
    assert [p.stat().st_mtime_ns for p in done] == times
    assert shards.read_manifest(str(killed)) is None

    def counts_shards(*args):
        shuffled.append(args[2])
        return write_shard(*args)

    monkeypatch.setattr(preparation, "_write_shard", counts_shards)
    manifest = preparation.prepare_shards(corpora, str(killed), vocabulary, plan)
    assert shuffled == [0, 1, 2, 3, 4]  # shard 0 was complete and kept
    assert shard_bytes(killed) == shard_bytes(clean)
    assert manifest["corpora"] == json.loads((clean / "manifest.json").read_text())["corpora"]


def test_only_a_complete_preparation_of_the_same_data_is_read(tmp_path, vocabulary):
    corpora = [pairs_corpus("pairs", generate_pairs(300, seed=7))]
    plan = make_plan(corpora, identity={"corpus": "a"})
    preparation.prepare_shards(corpora, str(tmp_path), vocabulary, plan)
    assert shards.read_manifest(str(tmp_path), {"corpus": "a"}) is not None
    with pytest.raises(DataError, match=r"other settings \(corpus\)"):
        shards.read_manifest(str(tmp_path), {"corpus": "b"})
    shard = tmp_path / shards.shard_name(0, 1)
    shard.write_bytes(shard.read_bytes()[:-7])  # a shard cut short
    assert shards.read_manifest(str(tmp_path), {"corpus": "a"}) is None
    shard.unlink()
    assert shards.read_manifest(str(tmp_path), {"corpus": "a"}) is None


def test_each_worker_reads_its_own_shards_and_together_all(tmp_path, vocabulary):
    corpora = [pairs_corpus("pairs", generate_pairs(500, seed=8))]
    plan = make_plan(corpora, shard_size=1000, min_shards=2)
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, plan)
    assert len(manifest["corpora"][0]["shards"]) == 2
    everything = examples_of(shards.read_examples(manifest, str(tmp_path)).as_numpy_iterator())
    per_worker = [
        examples_of(
            shards.read_examples(manifest, str(tmp_path), True, 0, worker, 2).as_numpy_iterator()
        )
        for worker in range(2)
    ]
    assert all(per_worker) and not set(per_worker[0]) & set(per_worker[1])
    assert sorted(per_worker[0] + per_worker[1]) == sorted(everything)
    with pytest.raises(DataError, match="fewer than the 3 input pipelines"):
        shards.read_examples(manifest, str(tmp_path), True, 0, 0, 3)


def labelled_pairs(labels, per_label, seed):
    """Pairs whose target starts with a label word; their lengths do not depend on the label."""
    pairs = generate_pairs(labels * per_label, seed=seed)
    return [(s, f"{'abcdefghij'[i // per_label]}z {t}") for i, (s, t) in enumerate(pairs)]


def label_mix(batches, spm_path, limit=60):
    """Mean share of each batch's commonest label, over `limit` batches."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=spm_path)
    shares = []
    for (_, target_input), _ in batches.take(limit).as_numpy_iterator():
        labels = [processor.decode([int(row[1])])[:1] for row in target_input]
        shares.append(collections.Counter(labels).most_common(1)[0][1] / len(labels))
    return float(np.mean(shares))


def test_a_sorted_corpus_trains_on_batches_as_mixed_as_a_shuffled_one(tmp_path):
    labels, per_label = 10, 600
    ordered = labelled_pairs(labels, per_label, seed=9)
    shuffled = [ordered[i] for i in np.random.default_rng(0).permutation(len(ordered))]
    spm_path = str(tmp_path / "spm.model")
    train_sentencepiece(
        [s for pair in ordered for s in pair],
        spm_path,
        400,
        whole_tokens=[f"{c}z" for c in "abcdefghij"],
    )

    def batches(pairs, name):
        corpora = [pairs_corpus(name, pairs)]
        folder = str(tmp_path / name)
        manifest = preparation.prepare_shards(
            corpora, folder, spm_path, make_plan(corpora, shard_size=500)
        )
        examples = shards.read_examples(manifest, folder, shuffle=True, seed=1)
        return batch_examples(examples, 512, 64, shuffle=True, repeat=True, shuffle_buffer=200)

    sorted_mix, random_mix = (
        label_mix(batches(ordered, "sorted"), spm_path),
        label_mix(batches(shuffled, "random"), spm_path),
    )
    # The commonest of 10 labels in a batch of about 20-40 examples: about 0.25 in random order.
    assert abs(sorted_mix - random_mix) < 0.05, (sorted_mix, random_mix)
    # Read in corpus order through the same buffer, the sorted corpus trains in blocks.
    in_order = tf.data.Dataset.from_tensor_slices(
        ([s for s, _ in ordered], [t for _, t in ordered])
    )
    tokenized = tokenize_examples(in_order, load_tokenizer(spm_path), 64)
    blocks = label_mix(
        batch_examples(tokenized, 512, 64, shuffle=True, repeat=True, shuffle_buffer=200), spm_path
    )
    assert blocks > random_mix + 0.3, (blocks, random_mix)


def test_corpora_are_mixed_by_their_weights(tmp_path, vocabulary):
    big = pairs_corpus("big", [(f"{i}", f"big {i}") for i in range(900)])
    small = pairs_corpus("small", [(f"{i}", f"small {i}") for i in range(100)], weight=None)

    def share_of_small(corpora, name):
        folder = str(tmp_path / name)
        manifest = preparation.prepare_shards(corpora, folder, vocabulary, make_plan(corpora))
        stream = shards.read_examples(manifest, folder, shuffle=True, seed=2).take(4000)
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor(model_file=vocabulary)
        targets = [processor.decode(e["target"][1:-1].tolist()) for e in stream.as_numpy_iterator()]
        return sum(t.startswith("small") for t in targets) / len(targets)

    assert abs(share_of_small([big, small], "by_size") - 0.1) < 0.025
    big.weight, small.weight = 1.0, 1.0
    assert abs(share_of_small([big, small], "even") - 0.5) < 0.035


def test_bpe_dropout_copies_are_other_segmentations_of_the_same_text(tmp_path, vocabulary):
    import sentencepiece as spm

    pairs = generate_pairs(200, seed=10)
    corpora = [pairs_corpus("pairs", pairs)]
    plan = make_plan(corpora, copies=2)
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, plan, alpha=0.3)
    assert manifest["corpora"][0]["examples"] == 400
    processor = spm.SentencePieceProcessor(model_file=vocabulary)
    read = examples_of(shards.read_examples(manifest, str(tmp_path)).as_numpy_iterator())
    texts = collections.Counter(processor.decode(list(target[1:-1])) for _, target in read)
    assert texts == collections.Counter(t for _, t in pairs for _ in range(2))
    plain = {tuple(processor.encode(t)) for _, t in pairs}
    changed = sum(tuple(target[1:-1]) not in plain for _, target in read) / len(read)
    # As often as sentencepiece's own BPE-dropout changes a segmentation at the same alpha.
    sampled = [processor.encode(t, enable_sampling=True, alpha=0.3) for _, t in pairs * 2]
    reference = sum(tuple(ids) not in plain for ids in sampled) / len(sampled)
    assert 0.1 < changed and abs(changed - reference) < 0.1, (changed, reference)

    # Seeded on one thread: the same plan samples the same copies, another seed others.
    def prepare(name, plan):
        preparation.prepare_shards(corpora, str(tmp_path / name), vocabulary, plan, 0.3, threads=1)
        return shard_bytes(tmp_path / name)

    assert prepare("one", plan) == prepare("again", plan)
    assert prepare("other", make_plan(corpora, seed=1, copies=2)) != prepare("one", plan)


def test_progress_lines_give_the_rate_and_the_time_left(caplog):
    import logging

    now = [0.0]
    progress = Progress("Tokenizing a / b", total=1000, clock=lambda: now[0])
    with caplog.at_level(logging.INFO):
        now[0] = 10.0
        progress.update(100)  # 10 s: too soon for a line
        now[0] = 40.0
        progress.update(300)
    assert caplog.messages == ["Tokenizing a / b: 400/1,000 pairs, 10 pairs/s, about 60 s left"]


def test_training_batches_leave_out_pairs_over_max_length(tmp_path, vocabulary):
    pairs = generate_pairs(400, seed=11)
    corpora = [pairs_corpus("pairs", pairs)]
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, make_plan(corpora))
    examples = shards.read_examples(manifest, str(tmp_path))
    kept = 0
    for (source, target_input), _ in batch_examples(examples, 256, 12, shuffle=False):
        assert source.shape[1] <= 12 and target_input.shape[1] <= 12
        kept += int(source.shape[0])
    short = tokenize_examples(pairs, load_tokenizer(vocabulary), 12)  # filters by length
    assert 0 < kept == sum(1 for _ in short) < 400


def test_parts_and_shards_of_another_vocabulary_are_not_kept(tmp_path, vocabulary, monkeypatch):
    corpora = [pairs_corpus("pairs", generate_pairs(500, seed=12))]
    preparation.prepare_shards(corpora, str(tmp_path), vocabulary, make_plan(corpora))
    written, write_shard = [], preparation._write_shard

    def counts_shards(*args):
        written.append(args[2])
        return write_shard(*args)

    monkeypatch.setattr(preparation, "_write_shard", counts_shards)
    preparation.prepare_shards(corpora, str(tmp_path), vocabulary, make_plan(corpora))
    assert written == []  # the same identity: complete shards are kept
    other = make_plan(corpora, identity={"vocabulary": "another"})
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, other)
    assert written == [0, 1, 2]
    assert shards.read_manifest(str(tmp_path), {"vocabulary": "another"}) == manifest


def test_lines_too_long_to_train_on_are_counted_and_left_out(tmp_path, vocabulary, caplog):
    from pipelines.data.corpus import MAX_CHARACTERS

    pairs = generate_pairs(30, seed=13) + [("x" * (MAX_CHARACTERS + 1), "y")]
    corpora = [pairs_corpus("pairs", pairs)]
    plan = make_plan(corpora)
    assert plan["pairs"] == [30] and plan["lines"] == [31]
    assert "Dropped 1 pairs with a side over 32767 characters" in caplog.text
    manifest = preparation.prepare_shards(corpora, str(tmp_path), vocabulary, plan)
    assert manifest["corpora"][0]["examples"] == 30
