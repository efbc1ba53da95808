"""Recipes, config files and flags resolve to the model and data a run really uses."""

import json

import pytest

from keras_transformer.models.presets import PRESETS
from pipelines.data.default_corpus import default_corpus
from pipelines.errors import ConfigError
from pipelines.training.config import MODEL_SIZES, TrainConfig, load_config
from pipelines.training.recipes import RECIPES


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_record_the_model_they_train(recipe):
    config = load_config(recipe, overrides={"multi30k_dir": "multi30k"})
    recorded = json.loads(config.to_json())
    arguments = config.model_arguments(100)
    if recorded["preset"] is None:
        # No preset named: the recorded model holds every size argument itself.
        assert set(MODEL_SIZES) <= set(recorded["model"])
        assert arguments == {"vocabulary_size": 100, **recorded["model"]}
    else:
        # A preset named: it is what the model is, nothing overridden.
        assert recorded["model"] == {}
        assert arguments == {"vocabulary_size": 100, **PRESETS[recorded["preset"]]}


def test_a_preset_flag_replaces_the_recipe_model():
    config = load_config("default", overrides={"preset": "transformer_base"})
    assert config.model == {}
    assert config.model_arguments(10)["hidden_dim"] == 512
    config = load_config(
        "default", overrides={"preset": "transformer_base", "model": {"dropout": 0.2}}
    )
    assert config.model_arguments(10)["hidden_dim"] == 512
    assert config.model_arguments(10)["dropout"] == 0.2


def test_no_preset_needs_every_size():
    model = {"num_layers": 1, "hidden_dim": 8, "intermediate_dim": 8}
    with pytest.raises(ConfigError, match="model needs \\['num_heads'\\]"):
        TrainConfig(preset=None, model=model).validate()


def test_one_default_for_the_default_corpus_sizes():
    splits = default_corpus()
    sizes = [len(splits[name]) for name in ("train", "validation", "test")]
    assert sizes == TrainConfig().default_corpus_sizes == load_config().default_corpus_sizes


def test_the_run_logs_under_its_own_module_name():
    from pipelines.training import run

    assert run.logger.name == "pipelines.training.run" == run.__name__


def test_a_run_may_be_given_in_minutes_instead_of_steps():
    config = load_config("default", overrides={"max_minutes": 5.0}, settings={"steps": None})
    assert config.steps is None and config.max_minutes == 5.0
    assert load_config("default", overrides={"steps": None}).steps == RECIPES["default"]["steps"]
    with pytest.raises(ConfigError, match="only with max_minutes"):
        load_config("default", settings={"steps": None})
    with pytest.raises(ConfigError, match="more than reserve_minutes"):
        load_config("default", overrides={"max_minutes": 1.0}, settings={"reserve_minutes": 2.0})
    with pytest.raises(ConfigError, match="cooldown=1.5"):
        load_config("default", settings={"cooldown": 1.5})


def test_subword_sampling_settings_are_checked():
    config = load_config("default", overrides={"subword_sampling": 0.1})
    assert config.subword_sampling == 0.1 and config.subword_copies == 4
    with pytest.raises(ConfigError, match="subword_sampling=1.0"):
        load_config("default", overrides={"subword_sampling": 1.0})
    with pytest.raises(ConfigError, match="subword_copies=0"):
        load_config("default", settings={"subword_copies": 0})
