import gzip
import logging

import pytest
import tensorflow_datasets as tfds

from pipelines.data.corpus import load_multi30k, load_tfds, read_parallel_files
from pipelines.errors import DataError


def write(path, lines, compress=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def test_plain_and_gzip_files_read_the_same(tmp_path):
    source, target = ["a b", "c"], ["x", "y z"]
    plain = read_parallel_files(write(tmp_path / "s", source), write(tmp_path / "t", target))
    packed = read_parallel_files(
        write(tmp_path / "s.gz", source, True), write(tmp_path / "t.gz", target, True)
    )
    assert plain == packed == [("a b", "x"), ("c", "y z")]


def test_mismatched_files_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "train.en", ["a", "b", "c"])
    target = write(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(DataError) as error:
        read_parallel_files(source, target)
    message = str(error.value)
    assert source in message and target in message
    assert "3 lines" in message and "2 lines" in message


def test_bad_utf8_names_file_and_line(tmp_path):
    source = tmp_path / "bad.en"
    source.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    target = write(tmp_path / "ok.de", ["a", "b", "c"])
    with pytest.raises(DataError, match=r"bad\.en, line 3: not valid UTF-8"):
        read_parallel_files(str(source), target)


def test_empty_pairs_are_dropped_and_counted(tmp_path, caplog):
    source = write(tmp_path / "s", ["a", "   ", "c", "d"])
    target = write(tmp_path / "t", ["x", "y", "", "w"])
    with caplog.at_level(logging.WARNING):
        pairs = read_parallel_files(source, target)
    assert pairs == [("a", "x"), ("d", "w")]
    assert "Dropped 2 of 4 pairs" in caplog.text


def test_empty_corpus_and_missing_path_are_errors(tmp_path):
    empty = write(tmp_path / "empty", [" ", ""])
    with pytest.raises(DataError, match="empty"):
        read_parallel_files(empty, empty)
    with pytest.raises(DataError, match="File not found: .*nowhere.en"):
        read_parallel_files(str(tmp_path / "nowhere.en"), empty)


def test_multi30k_official_layout(multi30k_dir):
    train = load_multi30k(multi30k_dir, "train")
    validation = load_multi30k(multi30k_dir, "validation", "en", "fr")
    test = load_multi30k(multi30k_dir, "test")
    assert (len(train), len(validation), len(test)) == (29000, 1014, 1000)
    with gzip.open(f"{multi30k_dir}/test_2016_flickr.de.gz", "rt", encoding="utf-8") as handle:
        last_german = handle.read().splitlines()[-1].strip()
    assert test[-1][1] == last_german
    with pytest.raises(DataError, match="Multi30k folder not found"):
        load_multi30k(multi30k_dir + "-missing", "train")


def test_tfds_translation_dataset_with_mock_data():
    with tfds.testing.mock_data(num_examples=7):
        dataset = load_tfds("ted_hrlr_translate/pt_to_en", "train")
        pairs = list(dataset.as_numpy_iterator())
    assert len(pairs) == 7
    assert all(isinstance(s, bytes) and isinstance(t, bytes) for s, t in pairs)


def test_unknown_tfds_name_is_a_clear_error():
    with pytest.raises(DataError, match="Unknown TFDS dataset 'no_such_translate/xx-yy'"):
        load_tfds("no_such_translate/xx-yy", "train")


def test_tfds_source_language_chooses_the_direction():
    with tfds.testing.mock_data(num_examples=5):
        supervised = list(load_tfds("ted_hrlr_translate/pt_to_en", "train").as_numpy_iterator())
        english_first = load_tfds("ted_hrlr_translate/pt_to_en", "train", source_language="en")
        reversed_pairs = list(english_first.as_numpy_iterator())
        with pytest.raises(DataError, match=r"has the features \['en', 'pt'\], not 'de'"):
            load_tfds("ted_hrlr_translate/pt_to_en", "train", source_language="de")
    assert reversed_pairs == [(target, source) for source, target in supervised]
