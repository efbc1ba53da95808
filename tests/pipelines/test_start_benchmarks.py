"""Smoke runs of the start-from-a-model benchmarks: the JSON they write, not the timings."""

import json

import pytest

from benchmarks import finetune_domain, marian_import
from tests.pipelines.test_benchmarks import read


@pytest.mark.slow
def test_finetune_domain_smoke(tmp_path, capsys):
    output = tmp_path / "finetune.json"
    tiny = ["model.num_layers=1", "model.hidden_dim=32", "model.intermediate_dim=64",
            "vocabulary_size=200", "steps=4", "steps_per_epoch=2", "batch_tokens=512",
            "heldout_split=none"]  # fmt: skip
    argv = ["--output-dir", str(tmp_path / "runs"), "--steps", "2", "--sizes", "[300,20,20]",
            "--output", str(output), "--german-only", "--extend-vocabulary", "120",
            *[item for s in tiny for item in ("--set", s)]]  # fmt: skip
    assert finetune_domain.main(argv) == 0
    result = read(output)
    scores = result["greedy_bleu"]
    assert set(scores) == {"source", "in_domain", "in_domain_extended", "mixed_70_30"}
    pieces = result["pieces"]
    assert result["source"] == "de" and pieces["source"] == pieces["in_domain"] == 200
    assert pieces["in_domain_extended"] > 200  # the de_CH pieces a German vocabulary lacks
    assert all(0 <= bleu <= 100 for row in scores.values() for bleu in row.values())
    assert "de_CH test BLEU" in capsys.readouterr().out


@pytest.mark.slow
def test_marian_import_smoke(multi30k_dir, tmp_path):
    pytest.importorskip("transformers")
    output = tmp_path / "marian.json"
    shape = json.dumps({"layers": 1, "d_model": 32, "heads": 2, "ffn": 64, "vocabulary": 600})
    argv = ["--multi30k-dir", multi30k_dir, "--shape", shape, "--pieces", "200",
            "--train-sentences", "2000", "--sentences", "6", "--batch-size", "3",
            "--repeats", "1", "--max-output-length", "5", "--output", str(output)]  # fmt: skip
    assert marian_import.main(argv) == 0
    result = read(output)
    assert result["logits_max_difference"] < 1e-4 and result["import_seconds"] > 0
    # Equal work: every engine's outputs have the limit's length (a random model never ends).
    assert set(result["output_pieces_per_sentence"].values()) == {5}
    assert set(result["sentences_per_second"]) == {
        f"{engine}_beam{beam}"
        for engine in ("savedmodel", "transformers", "ctranslate2")
        for beam in (1, 4)
    }
