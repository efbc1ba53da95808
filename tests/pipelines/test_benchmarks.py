"""Benchmark smoke runs: a few steps each, checking the JSON they write, not the timings."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import (
    beam_stop_rule,
    common,
    controls_ctranslate2,
    corpus_scale,
    cpu_training_step,
    decoding,
    decoding_concurrency,
    decoding_controls,
    decoding_ops,
    decoding_profile,
    ema_vs_average,
    gpu_recipe_study,
    gpu_training,
    input_streams,
    int8_projection,
    int8_serving,
    long_run,
    multi30k_recipe,
    pipeline_efficiency,
    ptb_recipe,
    request_size,
    sampling,
    scoring,
    training_throughput,
    warmup,
)
from pipelines.serving.signatures import SIGNATURES
from tests.pipelines.conftest import tiny_translation_model


def read(path):
    with open(path, encoding="utf-8") as handle:
        result = json.load(handle)
    assert result["machine"]["cpus"] >= 1 and result["machine"]["date"] and result["machine"]["cpu"]
    return result


def test_pipeline_efficiency_smoke(multi30k_dir, tmp_path):
    output = tmp_path / "pipeline.json"
    argv = ["--multi30k-dir", multi30k_dir, "--sentences", "400", "--repeats", "1",
            "--vocabulary-size", "400", "--output", str(output)]  # fmt: skip
    assert pipeline_efficiency.main(argv) == 0
    results = read(output)["results"]
    for name in ("bucketed", "fixed_longest", "fixed_keras_io"):
        assert 0 < results[name]["padding_efficiency"] <= 1
        assert results[name]["examples"] == 400
        assert results[name]["real_tokens_per_second"] > 0
    # Lossless pipelines keep every token; the fixed length of 20 cuts some.
    assert results["bucketed"]["real_tokens"] == results["fixed_longest"]["real_tokens"]
    assert results["fixed_keras_io"]["truncated_tokens"] > 0
    assert (
        results["bucketed"]["padding_efficiency"] > results["fixed_longest"]["padding_efficiency"]
    )


def test_training_throughput_smoke(multi30k_dir, tmp_path):
    output = tmp_path / "training.json"
    argv = ["--multi30k-dir", multi30k_dir, "--sentences", "600", "--batches", "3",
            "--repeats", "2", "--batch-tokens", "256", "--vocabulary-size", "300",
            "--num-layers", "1", "--hidden-dim", "16", "--intermediate-dim", "32",
            "--num-heads", "2", "--matmul-sizes", "64", "--output", str(output)]  # fmt: skip
    assert training_throughput.main(argv) == 0
    result = read(output)
    ours, hub = result["results"]["ours"], result["results"]["keras_hub"]
    assert ours["parameters"] == hub["parameters"]  # the same model size
    for entry in (ours, hub):
        assert len(entry["seconds_per_pass"]) == 2 and entry["tokens_per_second"] > 0
        assert entry["mfu"] > 0 and entry["model_flops_per_second"] > 0
    assert result["speedup_over_keras_hub"] > 0 and result["flops_per_pass"] > 0


def test_model_flops_match_the_models_weights():
    """One source and one target token: 6 x (kernel weights + output layer), plus attention."""
    layers, d, f, v = 2, 8, 16, 10
    model = training_throughput.our_transformer(v, layers, d, f, 2, 0.0)
    kernels = sum(int(np.prod(w.shape)) for w in model.weights if w.path.endswith("kernel"))
    batch = np.array([[5, 0]]), np.array([[2, 0]]), None
    flops = training_throughput.model_flops(batch, layers, d, f, v)
    # Attention scores and values: encoder self, decoder self and cross, 2 x d each.
    attention = layers * 3 * 2 * d
    assert flops == 6 * (kernels + d * v + attention)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """An untrained tiny model's run folder and a source/reference pair of files."""
    root = tmp_path_factory.mktemp("benchmarks")
    run = root / "run"
    run.mkdir()
    model, spm_path = tiny_translation_model(
        run, 120, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2
    )
    model.save(run / "model.keras")
    (run / "config.json").write_text(json.dumps({"batching": {"max_length": 16}}))
    sentences = ["Monday, March 3, 2014", "4:08 PM", "12.5%", "84°C"] * 4
    (root / "source").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    (root / "reference").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return root


def test_decoding_smoke(tiny_run, tmp_path):
    run = tiny_run / "run"
    output = tmp_path / "decoding.json"
    argv = ["--run-dir", str(run), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1",
            "--beams", "1", "2", "--batch-size", "4", "--output", str(output)]  # fmt: skip
    assert decoding.main(argv) == 0
    result = read(output)
    decoders = ["cached", "uncached", "saved_model", "ctranslate2"]
    assert set(result["results"]) == {f"{d}_beam{b}" for d in decoders for b in (1, 2)}
    for entry in result["results"].values():
        assert entry["sentences_per_second"] > 0 and 0 <= entry["bleu"] <= 100
    ratios = result["ratios"]
    assert ratios["cached_over_uncached_beam2"] > 0
    assert 0 <= ratios["ctranslate2_identical_to_saved_model_beam1"] <= 1


@pytest.mark.slow  # two exports
def test_decoding_controls_smoke(tiny_run, tmp_path):
    output = tmp_path / "controls.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1", "--batch-size", "4",
            "--output", str(output)]  # fmt: skip
    assert decoding_controls.main(argv) == 0
    result = read(output)
    arms = ("off", "neutral", "all")
    assert set(result["results"]) == {f"beam{b}_{arm}" for b in (1, 4) for arm in arms}
    assert all(entry["sentences_per_second"] > 0 for entry in result["results"].values())
    assert set(result["ratios"]) == {f"beam{b}_{a}_time_over_off" for b in (1, 4) for a in arms[1:]}


@pytest.mark.slow  # five arms, each searched three times
def test_controls_ctranslate2_smoke(tiny_run, tmp_path):
    output = tmp_path / "controls_ct2.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--banned-words", "March", "4:08 PM",
            "--output", str(output)]  # fmt: skip
    assert controls_ctranslate2.main(argv) == 0
    result = read(output)
    assert set(result["results"]) == {"controls", "banned", "prefix", "prefix_alpha", "greedy"}
    for entry in result["results"].values():
        assert set(entry["percent_equal"]) == {"early_stop", "default"}
        assert all(0 <= share <= 100 for share in entry["percent_equal"].values())
    assert result["results"]["banned"]["controls"] == {"banned_words": "March\n4:08 PM"}


def test_decoding_concurrency_smoke(tiny_run, tmp_path):
    output = tmp_path / "concurrency.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1", "--beams", "2",
            "--batch-size", "4", "--output", str(output)]  # fmt: skip
    assert decoding_concurrency.main(argv) == 0
    results = read(output)["results"]
    threads = os.cpu_count() or 1
    names = ["saved_model_chunks1", "saved_model_chunks2", "saved_model_requests1",
             "saved_model_requests2", f"ctranslate2_1x{threads}",
             f"ctranslate2_2x{max(threads // 2, 1)}"]  # fmt: skip
    assert set(results) == {f"{name}_beam2" for name in names}
    # Chunks or requests in flight together change no translation, nor its place in the
    # output (each batch is searched alone).
    for name in names[1:4]:
        assert results[f"{name}_beam2"]["same_as_saved_model_chunks1"] == 16, name


def test_int8_projection_smoke(tmp_path):
    output = tmp_path / "projection.json"
    argv = ["--vocabulary-size", "300", "--hidden-dim", "32", "--rows", "4", "9",
            "--repeats", "1", "--output", str(output)]  # fmt: skip
    assert int8_projection.main(argv) == 0
    results = read(output)["results"]
    assert set(results) == {f"{case}_{n}" for case in int8_projection.CASES for n in (4, 9)}
    for name, entry in results.items():
        # Each int8 way approximates float32's logits: one scale a token (and a row).
        bound = 0.0 if name.startswith("float32") else 0.05
        assert entry["relative_error"] <= bound and entry["milliseconds"] > 0, name
    # The two int8 by int8 products are the same computation.
    assert results["int8_matmul_stored_9"]["relative_error"] == pytest.approx(
        results["int8_matmul_transposed_9"]["relative_error"]
    )


@pytest.mark.slow  # three exports, three serving processes
def test_int8_serving_smoke(tiny_run, tmp_path):
    output = tmp_path / "int8.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1", "--beams", "2",
            "--batch-size", "4", "--large", "16", "32", "--signatures",
            "--output", str(output)]  # fmt: skip
    assert int8_serving.main(argv) == 0
    result = read(output)
    exports = ("float32", "int8", "int8-weights")
    decoders = [*exports, "ctranslate2_int8", "ctranslate2_float32"]
    assert set(result["results"]) == {f"{d}_{n}_beam2" for d in decoders for n in (1, 2)}
    assert all(entry["sentences_per_second"] > 0 for entry in result["results"].values())
    assert len(result["ratios"]) == 8 and all(value > 0 for value in result["ratios"].values())
    for name in exports:
        assert sorted(result["large_requests"][name]) == ["16", "32"]
        for report in result["large_requests"][name].values():
            assert report["loaded_kib"] > 0 and report["seconds"] > 0
        assert result["export_bytes"][name] > 0


@pytest.mark.slow  # three exports, three serving processes
def test_int8_serving_memory_only_exports_and_measures_without_timing(tiny_run, tmp_path):
    output = tmp_path / "int8.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--large", "16", "--signatures",
            "--memory-only", "--loader", "session", "--output", str(output)]  # fmt: skip
    assert int8_serving.main(argv) == 0
    result = read(output)
    assert result["results"] == {} and result["ratios"] == {} and result["repeats"] == 0
    assert result["loader"] == "session"
    assert result["parameters"] > 0
    for name in ("float32", "int8", "int8-weights"):
        (report,) = result["large_requests"][name].values()
        assert report["peak_kib"] >= report["loaded_kib"] > 0


def test_time_cases_warms_up_then_interleaves_the_cases_each_repeat():
    calls, repeats = [], []
    seconds, outputs = common.time_cases(
        lambda case: calls.append(("run", case)) or f"out {case} {len(calls)}",
        ["a", "b"],
        3,
        warm_up=lambda case: calls.append(("warm", case)),
        after_repeat=lambda seconds, outputs: repeats.append(len(seconds["b"])),
    )
    assert calls == [("warm", "a"), ("warm", "b")] + [("run", "a"), ("run", "b")] * 3
    assert repeats == [1, 2, 3]
    assert {case: len(times) for case, times in seconds.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for times in seconds.values() for t in times)
    assert outputs == {"a": "out a 7", "b": "out b 8"}  # the last run's


def test_length_sorted_batches_cut_the_graphs_order():
    batches = decoding_concurrency.length_sorted_batches([3, 1, 2, 1, 5], 2)
    assert batches == [[1, 3], [2, 0], [4]]  # equal lengths keep their order


@pytest.mark.slow
def test_multi30k_recipe_smoke(multi30k_dir, tmp_path):
    output = tmp_path / "recipe.json"
    argv = ["--multi30k-dir", multi30k_dir, "--output-dir", str(tmp_path / "run"),
            "--set", "steps=4", "--set", "steps_per_epoch=2", "--set", "vocabulary_size=500",
            "--set", "model.num_layers=1", "--set", "model.hidden_dim=16",
            "--set", "model.intermediate_dim=32", "--set", "model.num_heads=2",
            "--test-sentences", "20", "--beam-size", "2", "--output", str(output)]  # fmt: skip
    assert multi30k_recipe.main(argv) == 0
    result = read(output)
    assert result["steps"] == 4 and result["seconds"]["training"] > 0
    for case in ("cased", "lowercased"):
        assert result["test_2016_flickr"][case]["sentences"] == 20
    assert "case:lc" in result["test_2016_flickr"]["lowercased"]["bleu_signature"]


@pytest.mark.slow
def test_ptb_recipe_smoke(tmp_path):
    from tests.pipelines.parsing.synthetic import write_treebank

    treebank = write_treebank(tmp_path / "treebank", files=((1, 40), (142, 6), (180, 4)))
    output = tmp_path / "recipe.json"
    argv = ["--treebank-dir", treebank, "--output-dir", str(tmp_path / "run"),
            "--set", "steps=4", "--set", "max_minutes=null", "--set", "steps_per_epoch=2",
            "--set", "vocabulary_size=120", "--set", "batch_tokens=1100",
            "--set", "model.num_layers=1", "--set", "model.hidden_dim=16",
            "--set", "model.intermediate_dim=32", "--set", "model.num_heads=2",
            "--beam-size", "2", "--output", str(output)]  # fmt: skip
    assert ptb_recipe.main(argv) == 0
    result = read(output)
    assert result["steps"] == 4
    # As the export records them: the flag's beam, the recipe's alpha and output limit.
    assert result["search"] == {"beam_size": 2, "alpha": 0.3, "nbest": 2, "extra_length": 600,
                                "penalty_form": "gnmt", "max_output_length": 0,
                                "end_at_limit": False, "batching": False,
                                "max_source_length": 1100,
                                "tree_constraint": True,
                                "tree_words": True, "quantize": None,
                                "signatures": list(SIGNATURES)}  # fmt: skip
    assert set(result["splits"]) == {"dev", "test"}  # test files present: scored too
    for split, sentences in (("dev", 6), ("test", 4)):
        found = result["splits"][split]
        assert found["parser"]["all"]["sentences"] == sentences
        assert found["right_branching"]["all"]["sentences"] == sentences
    assert result["greedy_parse_from_training"]["split"] == "test"


def test_decoding_profile_smoke(tiny_run, tmp_path):
    output = tmp_path / "profile.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--batch-size", "4", "--repeats", "1", "--beams", "1", "2",
            "--output", str(output)]  # fmt: skip
    assert decoding_profile.main(argv) == 0
    for entry in read(output)["results"].values():
        shares = entry["share_by_kind"]
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
        assert shares["matrix products"] > 0 and entry["ops_per_call"] > 100
        assert entry["steps"] >= 1 and entry["milliseconds_per_step"] > 0


def test_decoding_ops_smoke(tmp_path):
    output = tmp_path / "ops.json"
    argv = ["--rows", "3", "--keys", "2", "5", "--vocabulary", "40", "--steps", "2",
            "--repeats", "1", "--output", str(output)]  # fmt: skip
    assert decoding_ops.main(argv) == 0
    results = read(output)["results"]
    assert set(results) == {"vocabulary", "ban", "attention_logits", "attention_sum"}
    assert set(results["attention_sum"]["batched_matmul"]) == {"rows=3,keys=2", "rows=3,keys=5"}
    assert "(loop alone)" in results["ban"]
    for piece in results.values():
        for shapes in piece.values():
            for entry in shapes.values():
                assert entry["same_result"] and entry["microseconds"] > 0


def test_decoding_ops_forms_compute_greedys_choice_and_attention():
    import tensorflow as tf

    inputs, candidates = decoding_ops.vocabulary_forms(tf, rows=40, vocabulary=7, width=16)[
        "vocabulary"
    ]
    # Greedy's choice by NumPy: the most probable token but padding and start.
    logits = inputs.numpy() @ decoding_ops.output_kernel(tf, 16, 7).numpy()
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_probs[:, [decoding_ops.PAD, decoding_ops.BOS]] = -np.inf
    assert np.isin(logits.argmax(-1), [decoding_ops.PAD, decoding_ops.BOS]).any()  # bans matter
    for name, function in candidates.items():
        chosen = function(inputs).numpy()  # (R, 2)
        np.testing.assert_array_equal(chosen[:, 1], log_probs.argmax(-1), err_msg=name)
        np.testing.assert_allclose(chosen[:, 0], log_probs.max(-1), atol=1e-5, err_msg=name)
    values = decoding_ops.attention_values(tf, 40, 3, heads=2, head_dim=4).numpy()  # (R, H, S, K)
    pieces = decoding_ops.attention_forms(tf, rows=40, keys=3, heads=2, head_dim=4)
    queries, candidates = pieces["attention_logits"]
    expected = np.einsum("rhqk,rhsk->rhqs", queries.numpy(), values)
    for name, function in candidates.items():
        np.testing.assert_allclose(function(queries).numpy(), expected, atol=1e-5, err_msg=name)
    weights, candidates = pieces["attention_sum"]
    expected = np.einsum("rhqs,rhsk->rhqk", weights.numpy(), values)
    for name, function in candidates.items():
        np.testing.assert_allclose(function(weights).numpy(), expected, atol=1e-5, err_msg=name)


def test_profile_kinds_name_the_ops_that_matter():
    assert decoding_profile.kind_of("_MklBatchMatMulV2") == "matrix products"
    assert decoding_profile.kind_of("_MklNativeFusedMatMul") == "matrix products"
    assert decoding_profile.kind_of("GatherV2") == "copies and layout"
    assert decoding_profile.kind_of("TopKV2") == "top-k and argmax"
    assert decoding_profile.kind_of("AddV2") == "element-wise"


def test_results_name_the_cpu_and_its_vector_extensions(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    processor = (
        "processor\t: {0}\nmodel name\t: AMD EPYC 9R14\n"
        "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni fma\n\n"
    )
    cpuinfo.write_text(processor.format(0) + processor.format(1))
    assert common.cpu_model(str(cpuinfo)) == ("AMD EPYC 9R14", ["AVX2", "AVX-512", "AVX-512 VNNI"])
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: sse2 avx\n")
    assert common.cpu_model(str(cpuinfo)) == ("Old CPU", [])
    name, extensions = common.cpu_model(str(tmp_path / "missing"))
    assert name and extensions == []


def test_beam_stop_rule_smoke(tiny_run, tmp_path):
    output = tmp_path / "rule.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1",
            "--output", str(output)]  # fmt: skip
    assert beam_stop_rule.main(argv) == 0
    result = read(output)
    assert set(result["results"]) == {"default", "early_stop"}
    assert 0 <= result["translations_that_differ"] <= result["sentences"] == 16


@pytest.mark.slow  # one export, two serving processes
def test_both_loaders_serve_the_same_translations(tiny_run, tmp_path):
    path = common.export_run(str(tiny_run / "run"), str(tmp_path / "model"), ["serving_default"])
    sentences = tmp_path / "sentences.json"
    lines = (tiny_run / "source").read_text(encoding="utf-8").splitlines()
    sentences.write_text(json.dumps(lines), encoding="utf-8")
    reports = [
        request_size.run_client(path, str(sentences), 8, loader) for loader in request_size.LOADERS
    ]
    assert len({report["translations_sha1"] for report in reports}) == 1
    for report in reports:
        assert report["peak_kib"] >= report["loaded_kib"] > 0


@pytest.mark.slow
def test_request_size_smoke(tiny_run, tmp_path):
    output = tmp_path / "requests.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--sentences", "16", "--small", "4", "--output", str(output)]  # fmt: skip
    assert request_size.main(argv) == 0
    result = read(output)
    assert result["results"]["requests_of_4"]["requests"] == 4
    for entry in result["results"].values():
        assert entry["peak_rss_mib"] >= entry["rss_after_loading_mib"] > 0


def test_gpu_training_says_why_it_cannot_run_without_a_gpu(tmp_path):
    output = tmp_path / "gpu.json"
    script = os.path.join(os.path.dirname(gpu_training.__file__), "gpu_training.py")
    for backend, reason in (("tensorflow", "needs KERAS_BACKEND=jax"), ("jax", "needs a GPU")):
        environment = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}
        run = subprocess.run(
            [sys.executable, script, "--output", str(output)],
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 2 and reason in run.stderr, run.stderr
    assert not output.exists()


def test_gpu_training_batches_look_like_the_pipelines():
    source, target_in, target_out = gpu_training.synthetic_batch(0, 256, 64, 37000)
    assert source.shape == target_in.shape == target_out.shape == (256, 64)
    lengths = np.sum(target_in != 0, axis=1)
    assert np.all(target_in[:, 0] == 2)  # begins with bos
    assert np.all(target_out[np.arange(256), lengths - 1] == 3)  # ends with eos
    assert np.array_equal(
        target_out[:, :-1][target_out[:, :-1] != 3], target_in[:, 1:][target_out[:, :-1] != 3]
    )
    assert np.all(np.sum(source != 0, axis=1) >= 32) and 0.7 < np.mean(source != 0) < 0.8
    assert source[source != 0].min() >= 4 and source.max() < 37000


def test_gpu_study_batches_hold_each_pair_once_a_pass_in_its_smallest_bucket():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=(300, 2))
    sources = [rng.integers(4, 50, s).astype("int32") for s, _ in lengths]
    targets = [
        np.concatenate([[1], rng.integers(4, 50, t), [2]]).astype("int32") for _, t in lengths
    ]
    stream = gpu_recipe_study.Batches(sources, targets, 256, 64, seed=3, pad_id=0, ratio=2.0)
    assert stream.bounds == [8, 16, 32, 64]
    seen = []
    for bucket, indices in stream.plan(0):
        (source, target_in), target_out = stream.batch(bucket, indices)
        bound = stream.bounds[bucket]
        assert source.shape == (256 // bound, bound) == target_in.shape == target_out.shape
        for row, index in enumerate(indices):
            real, steps = len(sources[index]), len(targets[index]) - 1
            assert bound == min(b for b in stream.bounds if b >= max(real, steps))
            np.testing.assert_array_equal(source[row, :real], sources[index])
            np.testing.assert_array_equal(target_in[row, :steps], targets[index][:-1])
            np.testing.assert_array_equal(target_out[row, :steps], targets[index][1:])
            assert not (source[row, real:].any() or target_out[row, steps:].any())
        for ids in (source, target_in, target_out):
            assert not ids[len(indices) :].any()  # padding rows hold no token
        seen += list(indices)
    assert sorted(seen) == list(range(300))
    assert [i.tolist() for _, i in stream.plan(1)] != [i.tolist() for _, i in stream.plan(0)]
    with pytest.raises(ValueError, match="above max_length 32"):
        gpu_recipe_study.Batches(sources, targets, 256, 32, seed=3, pad_id=0, ratio=2.0)


def test_gpu_profile_kinds_name_the_kernels_that_matter():
    assert gpu_training.kernel_kind("nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT") == "matrix products"
    assert gpu_training.kernel_kind("gemm_fusion_dot_80") == "matrix products"
    assert gpu_training.kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop") == (
        "attention (cuDNN)"
    )
    assert gpu_training.kernel_kind("input_reduce_fusion_111") == "reductions"
    assert gpu_training.kernel_kind("loop_add_fusion_11") == "element-wise fusions"


def test_cpu_training_step_smoke(multi30k_dir, tmp_path):
    output = tmp_path / "step.json"
    argv = ["--multi30k-dir", multi30k_dir, "--sentences", "300", "--batches", "2",
            "--repeats", "2", "--batch-tokens", "512", "--vocabulary-size", "300",
            "--num-layers", "1", "--profile-steps", "1", "--output", str(output)]  # fmt: skip
    assert cpu_training_step.main(argv) == 0
    result = read(output)
    today, xla = result["results"]["today"], result["results"]["xla"]
    for entry in result["results"].values():
        assert len(entry["real_target_tokens_per_second"]) == 2 and entry["median"] > 0
        assert 0 < entry["real_token_fraction"] <= 1
    assert sorted(result["results"]) == sorted(["today", *cpu_training_step.VARIANTS])
    assert today["compute_dtype"] == "float32"
    assert result["results"]["bfloat16"]["compute_dtype"] == "bfloat16"
    assert result["results"]["keras_attention"]["shapes_per_epoch"] == today["shapes_per_epoch"]
    assert result["keras_attention_over_today_steady"] > 0
    # Padding to a few fixed shapes: fewer shapes, more padding.
    assert xla["shapes_per_epoch"] < today["shapes_per_epoch"]
    assert xla["real_token_fraction"] < today["real_token_fraction"]
    assert result["today_profile"]["op_ms_per_step_by_kind"]["matrix products"] > 0


def test_the_keras_attention_variant_reaches_every_attention_layer():
    import keras_transformer as kt

    trainer = cpu_training_step.make_trainer(30, 2, keras_attention=True)
    layers = list(cpu_training_step.attention_layers(trainer.model))
    assert len(layers) == 2 + 2 * 2
    assert all(layer.fused_attention and layer.uses_fused_attention() for layer in layers)
    assert isinstance(layers[0], kt.MultiHeadAttention)


def test_scoring_smoke(tiny_run, tmp_path):
    output = tmp_path / "scoring.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "2",
            "--batch-size", "8", "--output", str(output)]  # fmt: skip
    assert scoring.main(argv) == 0
    result = read(output)
    assert result["pairs"] == 16 and sorted(result["seconds"]) == ["beam4", "greedy", "score"]
    assert all(len(values) == 2 for values in result["seconds"].values())
    rates = result["pairs_per_second"]
    assert result["score_over_beam4"] == pytest.approx(rates["score"] / rates["beam4"], rel=0.01)


@pytest.mark.slow  # an export of every signature, then two serving processes
def test_warmup_smoke(tiny_run, tmp_path):
    output = tmp_path / "warmup.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "1",
            "--request", "4", "--output", str(output)]  # fmt: skip
    assert warmup.main(argv) == 0
    result = read(output)
    assert sorted(result["results"]) == ["cold", "replayed"]
    for runs in result["seconds"].values():
        assert len(runs) == 1 and len(runs[0]) == 10 and min(runs[0]) > 0


def test_sampling_smoke(tiny_run, tmp_path):
    output = tmp_path / "sampling.json"
    argv = ["--run-dir", str(tiny_run / "run"), "--source", str(tiny_run / "source"),
            "--reference", str(tiny_run / "reference"), "--repeats", "2",
            "--batch-size", "8", "--output", str(output)]  # fmt: skip
    assert sampling.main(argv) == 0
    result = read(output)
    assert sorted(result["seconds"]) == [
        "greedy", "sample", "sample_top_k_1", "sample_top_p_0.9", "saved_model_greedy",
        "saved_model_sample", "saved_model_sample_top_k_10",
    ]  # fmt: skip
    # top_k 1 samples greedy search's outputs: the same tokens.
    assert result["output_tokens"]["sample_top_k_1"] == result["output_tokens"]["greedy"]
    rates = result["sentences_per_second"]
    assert result["sample_over_greedy"] == pytest.approx(
        rates["sample"] / rates["greedy"], rel=0.01
    )
    assert result["saved_model_top_k_over_greedy"] == pytest.approx(
        rates["saved_model_sample_top_k_10"] / rates["saved_model_greedy"], rel=0.01
    )


@pytest.mark.slow  # four processes: two training runs and two input streams
def test_corpus_scale_smoke(multi30k_dir, tmp_path):
    output, work = tmp_path / "corpus_scale.json", tmp_path / "work"
    argv = ["--multi30k-dir", multi30k_dir, "--sizes", "3000", "6000", "--work-dir", str(work),
            "--steps", "2", "--vocabulary-size", "300", "--batch-tokens", "512",
            "--encoder-pairs", "1000", "--stream-batch-tokens", "2048", "--stream-seconds", "1",
            "--output", str(output)]  # fmt: skip
    corpus_scale.main(argv)
    result = read(output)
    for size in ("3000", "6000"):
        run = result["runs"][size]
        assert run["pairs"] == int(size) and run["target_tokens"] > 20 * int(size)
        assert 0 < run["peak_mib_preparation"] <= run["peak_mib"]
        assert run["preparation_pairs_per_second"] > 0 and run["shard_bytes"] > 0
        assert run["seconds"]["scanned"] < run["seconds"]["model_built"]
    assert result["sentencepiece_encoder_pairs_per_second"] > 0
    assert all(run["preparation_over_encoder"] > 0 for run in result["runs"].values())
    assert result["stream_target_tokens_per_second_per_core"] > 0
    assert result["gpu_consumption"]["target_tokens_per_second"] > 0
    assert not work.exists()  # the corpora and runs are removed


@pytest.mark.slow  # eight processes: one a stream count, a pinned one, a service of three
def test_input_streams_smoke(multi30k_dir, tmp_path):
    output, work = tmp_path / "input_streams.json", tmp_path / "work"
    argv = ["--multi30k-dir", multi30k_dir, "--pairs", "3000", "--work-dir", str(work),
            "--vocabulary-size", "300", "--batch-tokens", "2048", "--seconds", "1",
            "--warm-up", "2", "--repeats", "2", "--service", "--output", str(output)]  # fmt: skip
    input_streams.main(argv)
    result = read(output)
    assert [len(result["runs"][s]) for s in ("1", "2")] == [2, 2]
    assert result["batches_over_budget"] == 0 and result["speedup_over_one_stream"]["1"] == 1.0
    rates = [r["target_tokens_per_second"] for r in result["runs"]["2"]]
    assert result["target_tokens_per_second"]["2"] == round(sum(rates) / 2)  # the median of 2
    assert result["one_stream_on_one_core"]["cores_busy"] <= 1.05
    served = result["service"]  # two pinned `kt data-service` workers, read from a third process
    assert served["streams"] == 2 and served["over_budget"] == 0 and served["batches"] > 0
    assert len(served["worker_peak_mib"]) == 2 and min(served["worker_peak_mib"]) > 0
    assert not work.exists()


def test_corpus_scale_lines_are_two_multi30k_sentences(multi30k_dir, tmp_path):
    from pipelines.data.corpus import load_multi30k, read_parallel_files

    targets = {}  # a training source's translations
    for source, target in load_multi30k(multi30k_dir, "train"):
        targets.setdefault(source, set()).add(target)
    pairs = read_parallel_files(*corpus_scale.build_corpus(multi30k_dir, 50, str(tmp_path)))
    assert len(pairs) == 50
    for source, target in pairs:  # both sides join the same two training pairs
        assert any(
            source.startswith(first + " ")
            and any(
                target == f"{a} {b}"
                for a in targets[first]
                for b in targets.get(source[len(first) + 1 :], ())
            )
            for first in targets
        ), (source, target)


@pytest.mark.slow
def test_ema_vs_average_smoke(multi30k_dir, tmp_path):
    import keras

    output, run = tmp_path / "ema.json", tmp_path / "run"
    argv = ["--multi30k-dir", multi30k_dir, "--output-dir", str(run), "--steps", "6",
            "--ema", "0.5", "--set", "steps_per_epoch=2", "--set", "vocabulary_size=500",
            "--set", "model.num_layers=1", "--set", "model.hidden_dim=16",
            "--set", "model.intermediate_dim=32", "--set", "model.num_heads=2",
            "--sentences", "12", "--output", str(output)]  # fmt: skip
    assert ema_vs_average.main(argv) == 0
    result = read(output)
    assert result["steps"] == 6  # the second command trained nothing more
    for name in ("average", "ema"):
        assert set(result["bleu"][name]) == {"val", "test_2016_flickr"}
    average, ema = (
        keras.saving.load_model(run / "compared" / name / "model.keras").get_weights()
        for name in ("average", "ema")
    )
    assert any(not np.allclose(a, b) for a, b in zip(average, ema, strict=True))


@pytest.mark.slow
def test_long_run_smoke(tmp_path):
    output = tmp_path / "long_run.json"
    argv = ["--output-dir", str(tmp_path / "runs"), "--steps", "60", "--validate-every", "6",
            "--backup-every", "5", "--keep", "3", "--validation-sentences", "8",
            "--early", "10", "--late", "40", "--output", str(output)]  # fmt: skip
    assert long_run.main(argv) == 0
    result = read(output)
    resume, disk = result["resume"], result["disk"]
    assert 10 <= resume["early_step"] < resume["late_step"] == resume["resumed_at_step"] < 60
    assert resume["early_seconds_to_first_step"] > 0 and resume["late_seconds_to_first_step"] > 0
    assert resume["max_weight_difference_to_uninterrupted"] < 1e-4  # the same batches
    assert not resume["skipped_batches"]
    # 10 epochs, 3 kept (the last 3, as averaging reads 1), best.keras beside them.
    assert disk["epoch_checkpoints_kept"] == 3 and "best.keras" in disk["checkpoint_files"]
    assert 1.0 < disk["epoch_checkpoint_over_weights"] < 2.0  # no optimizer state
    assert 0 < result["validation"]["share"] < 1
    # The killed run alone, reported from the same runs: nothing compared with the whole one.
    alone = tmp_path / "alone.json"
    assert long_run.main([*argv[:-1], str(alone), "--resume-only", "--measure-only"]) == 0
    alone = read(alone)
    assert alone["resume"]["late_over_early"] == resume["late_over_early"]
    assert alone["resume"]["max_weight_difference_to_uninterrupted"] is None
    assert alone["validation"] is None and alone["whole_run_seconds"] is None
