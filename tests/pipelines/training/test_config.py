"""Typed settings: recipes, files and flags resolve to the run's model and data, or one error."""

import dataclasses
import inspect
import json

import pytest

from keras_transformer import Transformer
from keras_transformer.models.presets import PRESETS
from pipelines.commands import train
from pipelines.data.default_corpus import default_corpus
from pipelines.errors import ConfigError
from pipelines.training import recorded
from pipelines.training.config import (
    GROUPS,
    MODEL_SIZES,
    ModelConfig,
    TrainConfig,
    base_type,
    settings,
    validate,
)
from pipelines.training.loading import load_config, recipe_names

NUMERIC = [s for s in settings() if base_type(s.type)[0] in (int, float)]


def limit_breaker(item):
    """A value of the right type outside `item`'s declared range."""
    limits, kind = item.limits, base_type(item.type)[0]
    if "low" in limits:
        return kind(limits["low"] - 1)
    if "above" in limits:
        return kind(limits["above"])
    if "below" in limits:
        return kind(limits["below"])
    return kind(limits["high"] + 1)


def exit_status(argv):
    """`kt train`'s exit status: returned, or raised by the flag parser."""
    try:
        return train.main(argv)
    except SystemExit as exit_info:
        return exit_info.code


@pytest.fixture
def no_training(monkeypatch):
    """Fails the test if a command gets as far as training (reading data)."""
    from pipelines.training import run

    def refuse(config):
        raise AssertionError("training started")

    monkeypatch.setattr(run, "run_training", refuse)


def test_setting_names_are_unique_and_every_number_has_limits():
    names = [s.name for s in settings()]
    assert len(names) == len(set(names)) and len(names) > 40
    assert [s.group for s in settings()][0] == "data"
    assert not [s.name for s in NUMERIC if not {"low", "high", "above", "below"} & set(s.limits)]


def test_model_settings_cover_the_transformer_arguments():
    arguments = set(inspect.signature(Transformer.__init__).parameters) - {"self", "kwargs"}
    # The tokenizer decides the vocabulary and the special ids.
    decided_elsewhere = {
        "vocabulary_size", "target_vocabulary_size", "pad_id", "bos_id", "eos_id", "unk_id",
    }  # fmt: skip
    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"preset", "init_from"}
    assert fields == arguments - decided_elsewhere


@pytest.mark.parametrize("item", NUMERIC, ids=lambda s: s.name)
def test_a_wrong_type_for_any_number_is_one_error_before_any_work(item, no_training, capsys):
    assert train.main(["--set", f"{item.group}.{item.name}=abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and item.name in err[0], err
    assert "'abc'" in err[0]


@pytest.mark.parametrize("item", NUMERIC, ids=lambda s: s.name)
def test_a_value_out_of_range_is_one_error_before_any_work(item, no_training, capsys):
    value = limit_breaker(item)
    if base_type(item.type)[0] is list or item.limits.get("nargs"):
        value = [value] * item.limits["nargs"]
    flag = "--" + item.name.replace("_", "-")
    argv = [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    assert exit_status(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {item.name} must be"), err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "steps=abc"], "steps must be an integer. Received: steps='abc'"),
        (["--set", "model.num_heads=3"], "num_heads must divide hidden_dim (128)"),
        (["--set", "model.colour=red"], "Unknown setting 'model.colour' in --set"),
        (["--set", "batching.steps=5"], "Unknown setting 'batching.steps'"),
        (["--preset", "transformer_huge"], "preset must be one of"),
        (["--recipe", "nope"], "recipe must be one of"),
        (["--corpus", "multi30k"], "needs multi30k_dir"),
        (["--xla", "--steps"], "expected one argument"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--set", "steps"], "--set expects NAME=VALUE"),
        (["--train-files", "a"], "train_files takes SOURCE TARGET pairs, an even number"),
        (
            ["--train-files", "a", "b", "--train-weights", "1", "2"],
            "one weight per train_files pair (1)",
        ),
        (
            ["--train-files", "a", "b", "--train-weights", "0"],
            "train_weights must be more than 0.0",
        ),
        (["--set", "learned_positions=true"], "learned_positions needs max_positions"),
        (["--set", "normalize_first=maybe"], "normalize_first must be true or false"),
        (["--set", "model.activation=sigmoidal"], "activation must be a Keras activation"),
    ],
)
def test_bad_flags_are_one_error_line(argv, message, no_training, capsys):
    assert exit_status(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.parametrize(
    "content, message",
    [("[1, 2]", "must hold a JSON object"), ("{", "not valid JSON"), ('{"steps": "x"}', "steps")],
)
def test_a_bad_config_file_is_named(tmp_path, content, message, no_training, capsys):
    path = tmp_path / "run.json"
    path.write_text(content)
    assert train.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert train.main(["--config", str(tmp_path / "missing.json")]) == 2
    assert "config file not found" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", recipe_names())
def test_recipes_record_the_model_they_train(recipe):
    config = load_config(recipe, settings={"multi30k_dir": "multi30k", "treebank_dir": "ptb"})
    recorded = json.loads(config.to_json())
    assert list(recorded) == list(GROUPS)
    arguments = config.model_arguments(100)
    model = {k: v for k, v in recorded["model"].items() if v is not None and k != "preset"}
    if recorded["model"]["preset"] is None:
        # No preset named: the recorded model holds every size argument itself.
        assert set(MODEL_SIZES) <= set(model)
        assert arguments == {"vocabulary_size": 100, **model}
    else:
        # A preset named: it is what the model is, nothing overridden.
        assert model == {}
        assert arguments == {"vocabulary_size": 100, **PRESETS[recorded["model"]["preset"]]}


def test_print_config_prints_the_resolved_settings(no_training, capsys):
    argv = ["--recipe", "multi30k", "--multi30k-dir", "d", "--batch-tokens", "1024", "--xla"]
    assert train.main(argv + ["--set", "model.dropout=0.3", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["batching"]["batch_tokens"] == 1024 and printed["optimization"]["xla"] is True
    assert printed["model"]["dropout"] == 0.3 and printed["data"]["multi30k_dir"] == "d"
    assert printed["budget"]["max_minutes"] == 57


def test_a_config_file_nested_by_group_applies_over_the_recipe(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"batching": {"batch_tokens": 512}, "model.dropout": 0.3}))
    config = load_config("default", str(path), {"steps": "20"})
    assert config.batching.batch_tokens == 512 and config.model.dropout == 0.3
    assert config.optimization.steps == 20 and config.model.hidden_dim == 128


def test_a_preset_flag_replaces_the_recipe_model():
    config = load_config("default", settings={"preset": "transformer_base"})
    assert config.model == ModelConfig(preset="transformer_base")
    assert config.model_arguments(10)["hidden_dim"] == 512
    config = load_config("default", settings={"preset": "transformer_base", "model.dropout": 0.2})
    assert config.model_arguments(10)["hidden_dim"] == 512
    assert config.model_arguments(10)["dropout"] == 0.2


def test_every_dropout_reaches_the_model_arguments():
    overrides = {"model.attention_dropout": 0.1, "model.activation_dropout": 0.15}
    arguments = load_config("default", settings=overrides).model_arguments(10)
    base = load_config("default").model_arguments(10)
    assert arguments == {**base, "attention_dropout": 0.1, "activation_dropout": 0.15}


def test_no_preset_needs_every_size():
    config = TrainConfig(model=ModelConfig(preset=None, num_layers=1, hidden_dim=8))
    config.model.intermediate_dim = 8
    with pytest.raises(ConfigError, match="model needs \\['num_heads'\\]"):
        validate(config)


def test_the_tree_constraint_needs_whole_target_tokens():
    config = load_config("ptb", settings={"treebank_dir": "t"})
    validate(config)
    config.batching.whole_target_tokens = False
    with pytest.raises(ConfigError, match="tree_constraint needs whole_target_tokens"):
        validate(config)


def test_whole_source_words_leave_a_quarter_of_the_vocabulary_to_other_pieces():
    settings = {"treebank_dir": "t", "vocabulary_size": 4000, "whole_source_words": 3000}
    assert load_config("ptb", settings=settings).batching.whole_source_words == 3000
    with pytest.raises(ConfigError, match=r"at most three quarters of vocabulary_size \(4000\)"):
        load_config("ptb", settings={**settings, "whole_source_words": 3001})
    with pytest.raises(ConfigError, match="whole_source_words must be at least 0"):
        load_config("ptb", settings={**settings, "whole_source_words": -1})


def test_special_ids_come_from_the_tokenizer():
    ids = {"pad_id": 0, "bos_id": 2, "eos_id": 3}
    assert load_config().model_arguments(10, ids).items() >= ids.items()


def test_one_default_for_the_default_corpus_sizes():
    splits = default_corpus()
    sizes = [len(splits[name]) for name in ("train", "validation", "test")]
    assert (
        sizes == TrainConfig().data.default_corpus_sizes == load_config().data.default_corpus_sizes
    )


def test_the_run_logs_under_its_own_module_name():
    from pipelines.training import run

    assert run.logger.name == "pipelines.training.run" == run.__name__


def test_a_run_may_be_given_in_minutes_instead_of_steps():
    config = load_config("default", settings={"max_minutes": 5.0, "steps": None})
    assert config.optimization.steps is None and config.budget.max_minutes == 5.0
    with pytest.raises(ConfigError, match="only with max_minutes"):
        load_config("default", settings={"steps": None})
    with pytest.raises(ConfigError, match="more than reserve_minutes"):
        load_config("default", settings={"max_minutes": 1.0, "reserve_minutes": 2.0})
    with pytest.raises(ConfigError, match="cooldown=1.5"):
        load_config("default", settings={"cooldown": 1.5})


def test_subword_sampling_settings_are_checked():
    config = load_config("default", settings={"subword_sampling": 0.1})
    assert config.batching.subword_sampling == 0.1 and config.batching.subword_copies == 4
    with pytest.raises(ConfigError, match="subword_sampling=1.0"):
        load_config("default", settings={"subword_sampling": 1.0})
    with pytest.raises(ConfigError, match="subword_copies=0"):
        load_config("default", settings={"subword_copies": 0})


def test_run_max_length_reads_nested_and_flat_configs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"batching": {"max_length": 77}}))
    assert recorded.run_max_length(str(tmp_path)) == 77
    (tmp_path / "config.json").write_text(json.dumps({"max_length": 66}))
    assert recorded.run_max_length(str(tmp_path)) == 66
    assert recorded.run_max_length(str(tmp_path / "none")) is None


def test_run_decoding_reads_the_recorded_search_else_the_defaults(tmp_path):
    lengths = {"penalty_form": "gnmt", "max_output_length": 0, "end_at_limit": False}
    assert recorded.run_decoding(str(tmp_path)) == {
        "beam_size": 4,
        "alpha": 0.6,
        "extra_length": 50,
        "tree_constraint": False,
        **lengths,
    }
    config = load_config("ptb", settings={"treebank_dir": "t", "decoding.alpha": 0.5})
    (tmp_path / "config.json").write_text(config.to_json())
    assert recorded.run_decoding(str(tmp_path)) == {
        "beam_size": 21,
        "alpha": 0.5,
        "extra_length": 600,
        "tree_constraint": True,
        **lengths,
    }
    for bad, message in [
        ("[1]", "not a run's config.json"),
        ('{"decoding": 3}', "decoding is not an object"),
        ('{"decoding": {"beam_size": null}}', "beam_size may not be null"),
        ('{"decoding": {"alpha": -1}}', "alpha must be at least 0.0"),
        ('{"decoding": {"tree_constraint": 1}}', "tree_constraint"),
        ('{"decoding": {"penalty_form": "gnmt2"}}', "penalty_form"),
        ('{"decoding": {"max_output_length": -1}}', "max_output_length must be at least 0"),
        ('{"batching": [640]}', "batching is not an object"),
    ]:
        (tmp_path / "config.json").write_text(bad)
        with pytest.raises(ConfigError, match=message):
            recorded.run_decoding(str(tmp_path))
            recorded.run_max_length(str(tmp_path))


def test_choosing_by_validation_needs_validation_files():
    files = {"corpus": "files", "train_files": ["a.en", "a.de"]}
    for given in ({"select": "best"}, {"early_stopping_patience": 3}):
        with pytest.raises(ConfigError, match="corpus files needs validation_files"):
            load_config("default", settings={**files, **given})
        config = load_config(
            "default", settings={**files, **given, "validation_files": ["v.en", "v.de"]}
        )
        assert config.data.validation_files == ["v.en", "v.de"]
    assert load_config("default", settings=files).output.select == "average"  # no choice made
    assert load_config("default", settings={"select": "best"}).data.corpus == "default"


def test_extend_vocabulary_needs_init_from():
    with pytest.raises(ConfigError, match="extend_vocabulary grows a source's vocabulary"):
        load_config("default", settings={"extend_vocabulary": 100})
    assert load_config("default", settings={"byte_fallback": True}).batching.byte_fallback
    with pytest.raises(ConfigError, match="character_coverage"):
        load_config("default", settings={"character_coverage": 0.0})
