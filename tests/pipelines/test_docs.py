"""The docstring examples and docs pages under pipelines/ run and show what they claim."""

import doctest
import importlib
import pathlib
import re
import shlex

import pytest

from tests.test_case import modules_with_examples

# JaxTrainer's examples need the JAX backend: tests/jax_training runs them.
JAX_MODULES = {"pipelines.training.jax_trainer"}
MODULES = [(name, n) for name, n in modules_with_examples("pipelines") if name not in JAX_MODULES]


def test_the_library_modules_have_examples():
    names = {name for name, _ in MODULES}
    assert {"pipelines.data.default_corpus", "pipelines.training.trainer"} <= names


@pytest.mark.parametrize("module_name, examples", MODULES)
def test_docstring_examples(module_name, examples):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted >= examples, f"{result.attempted} of {examples} examples ran"


ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_training_guide_runs(tmp_path, monkeypatch):
    import tensorflow as tf

    from pipelines.training.parallel import make_strategy
    from tests.test_docs import run_python_blocks

    # One MirroredStrategy a process: a second one in this test process would
    # reuse the collective keys of the other tests' strategy.
    strategy, _ = make_strategy()
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda: strategy)
    monkeypatch.chdir(tmp_path)
    namespace = run_python_blocks(ROOT / "docs" / "training.md")
    assert len(namespace["history"].history["loss"]) == 2


def test_the_settings_table_is_current():
    from pipelines.training.settings_table import settings_markdown

    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    table = text.split("<!-- settings -->\n")[1].split("<!-- /settings -->")[0]
    assert table == settings_markdown(), (
        "regenerate it: python -m pipelines.training.settings_table"
    )


def test_the_api_reference_is_current():
    from pipelines.api_reference import api_pages

    pages = api_pages()
    committed = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "api").iterdir()}
    stale = sorted(name for name in pages | committed if pages.get(name) != committed.get(name))
    assert not stale, (
        f"docs/api/ {stale} differ from the docstrings; regenerate them: "
        "python -m pipelines.api_reference (and delete the pages it no longer writes)"
    )
    sizes = {name: len(text.encode("utf-8")) for name, text in pages.items()}
    assert max(sizes.values()) <= 15_000, f"split the pages over 15 KB (PAGES): {sizes}"


def test_the_pipelines_reference_documents_every_argument():
    """Each function, class and method on the pipelines' pages has an Args section naming its
    parameters (a class's constructor arguments in its own docstring)."""
    import inspect

    from pipelines.api_reference import PIPELINE_PAGES, members

    undocumented = []
    for _, _, groups in PIPELINE_PAGES:
        for module, names in groups:
            for name in names.split():
                obj = getattr(module, name)
                entries = [(name, obj, vars(obj).get("__doc__") if inspect.isclass(obj) else None)]
                if inspect.isclass(obj):
                    entries += [
                        (f"{name}.{method}", getattr(obj, method), None)
                        for method, value in members(obj)
                        if not isinstance(value, property)
                    ]
                for label, function, doc in entries:
                    doc = doc or function.__doc__ or ""
                    args = doc.partition("Args:")[2]
                    parameters = inspect.signature(function).parameters
                    for parameter in parameters.values():
                        if parameter.name == "self" or parameter.kind == parameter.VAR_KEYWORD:
                            continue
                        if not re.search(rf"\b{parameter.name}\b[^:\n]*:", args):
                            undocumented.append(f"{label}({parameter.name})")
    assert not undocumented, f"arguments missing from Args sections: {undocumented}"


@pytest.mark.parametrize("num_layers, hidden_dim, intermediate_dim", [(1, 8, 12), (2, 4, 6)])
def test_the_api_reference_counts_the_preset_parameters(num_layers, hidden_dim, intermediate_dim):
    """Its count, for tiny models with each preset's other settings, is a built model's."""
    import keras_transformer
    from pipelines.api_reference import parameters_without_embeddings

    for preset in keras_transformer.PRESETS.values():
        sizes = {**preset, "num_layers": num_layers, "hidden_dim": hidden_dim}
        sizes.update(intermediate_dim=intermediate_dim, num_heads=2)
        model = keras_transformer.Transformer(vocabulary_size=11, **sizes)
        model.build(((None, None), (None, None)))
        expected = parameters_without_embeddings(sizes)
        assert expected is None or model.count_params() == expected + 11 * hidden_dim


FIGURE = re.compile(r"([0-9][0-9,.]*x?)\**<!-- figure: ([a-z0-9-]+) -->")


def quoted_figures(path):
    """`(value, key)` of every figure marked `VALUE<!-- figure: KEY -->` in a Markdown file."""
    return FIGURE.findall(path.read_text(encoding="utf-8"))


def test_figures_quoted_elsewhere_agree_with_results_md():
    """docs/results*.md state each headline figure once; every marked quote elsewhere agrees."""
    defined = {}
    results = sorted((ROOT / "docs").glob("results*.md"))  # results.md and its split pages
    for page in results:
        for value, key in quoted_figures(page):
            assert key not in defined, f"docs/results*.md mark {key} twice"
            defined[key] = value
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "benchmarks").rglob("*.md")]
    pages += [page for page in (ROOT / "docs").rglob("*.md") if page not in results]
    quotes = [(page, value, key) for page in pages for value, key in quoted_figures(page)]
    for page, value, key in quotes:
        assert key in defined, f"{page.name}: {key} is not a figure of docs/results.md"
        assert value == defined[key], (
            f"{page.name}: {key} is {value}, docs/results.md says {defined[key]}"
        )
    # The README's results: at most four one-line rows, each quoting a marked figure.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Results", 1)[1].split("\n\n", 2)[1].splitlines()[2:]
    assert 1 <= len(table) <= 4 and all(FIGURE.search(row) for row in table), table


def test_the_figure_check_sees_a_disagreement(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("BLEU **39.85<!-- figure: multi30k-bleu-lowercased -->** and 2x\n")
    assert quoted_figures(page) == [("39.85", "multi30k-bleu-lowercased")]


# A token rate and the word before it: "target tokens/s", "real tokens a second".
RATE = re.compile(r"(\S+) tokens(?:/s| a second| per second)")
RATE_UNITS = ("target", "source", "source + target")


def unnamed_rates(text):
    """The token rates in `text` whose tokens are not named target, source or source + target."""
    return [
        match.group(0)
        for match in RATE.finditer(text)
        if not any(text[: match.end(1)].endswith(unit) for unit in RATE_UNITS)
    ]


def test_every_token_rate_names_its_tokens():
    pages = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks").rglob("*.md"),
    ]
    found = {
        str(page.relative_to(ROOT)): unnamed_rates(page.read_text(encoding="utf-8"))
        for page in pages
    }
    assert {name: rates for name, rates in found.items() if rates} == {}
    # The check has teeth.
    assert unnamed_rates("943,144 real tokens/s, 5,163 tokens a second") == [
        "real tokens/s",
        "5,163 tokens a second",
    ]
    assert unnamed_rates("361,589 target tokens/s; 2,167 source + target tokens/s") == []


def shown_commands():
    """Every `kt ...` command line in the shell blocks of README.md and docs/."""
    found = []
    for page in PAGES:
        for block in re.findall(
            r"```(?:sh|bash)\n(.*?)```", page.read_text(encoding="utf-8"), re.S
        ):
            block = block.replace("\\\n", " ")
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                # Environment settings before the command (KERAS_BACKEND=jax kt train ...).
                line = re.sub(r"^(?:[A-Z_]+=\S+ )+", "", line)
                if line.startswith("kt "):
                    found.append((page.name, line))
    return found


def test_the_docs_show_every_command():
    names = {shlex.split(line)[1] for _, line in shown_commands()}
    from pipelines import cli

    assert names == set(cli.COMMANDS)


@pytest.mark.parametrize("page, line", shown_commands(), ids=lambda x: str(x)[:60])
def test_every_command_shown_parses(page, line, monkeypatch):
    """The command line parses, and a train command's settings also validate."""
    import importlib

    from pipelines import cli
    from pipelines.training import loading

    argv = shlex.split(line)[1:]
    module = importlib.import_module(cli.COMMANDS[argv[0]])
    parsed = []
    monkeypatch.setattr(module, "run", lambda body, args: parsed.append(args) or 0)
    assert cli.main(argv) == 0
    (args,) = parsed
    if argv[0] == "train" and not args.config:
        from pipelines.commands.train import _settings, resolved_config

        if getattr(args, "init_from", None):  # no source run here: the other settings checked
            loading.load_config(args.recipe or "finetune", None, _settings(args))
        else:
            resolved_config(args)
