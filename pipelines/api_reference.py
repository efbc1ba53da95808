"""The API reference under docs/api/, made from signatures and docstrings.

It covers all of keras_transformer, and the part of the pipelines that a script of one's own calls:
data, training, export and the serving client.

Regenerate it from the repository root with `python -m pipelines.api_reference`;
a test checks that docs/api/ holds what this writes.
"""

import inspect
import pathlib
import re
import sys

import keras_transformer
from keras_transformer import decoding, layers, tokenizers
from pipelines import evaluation
from pipelines.data import batching, corpus, tokenizer
from pipelines.serving import client, ctranslate2, sampling, saved_model, translation
from pipelines.training import checkpoints, jax_trainer, loading, optimizers, trainer

MODULES = (keras_transformer, layers, decoding, tokenizers)
# The pages after the index, in its order: file, title, the module whose docstring opens the page
# (or None), public names. Every public name is on one page; a test keeps each under 15 KB.
PAGES = (
    ("models.md", "Models", None, "Transformer PRESETS"),
    ("layers.md", "Layers", None,
     "MultiHeadAttention FeedForward TokenEmbedding PositionalEncoding"),
    ("layers-stacks.md", "Encoder and decoder layers", None,
     "EncoderLayer Encoder DecoderLayer Decoder"),
    ("decoding.md", "Decoding", decoding,
     "greedy_search beam_search sample score_hypotheses length_penalty PENALTY_FORMS"),
    ("decoding-helpers.md", "Decoding: controls, constraints and the helpers the searches share",
     None, "DecodingControls BracketConstraint filter_log_probs IMPOSSIBLE prepare_search "
     "SearchSetup CachedSteps RecomputedSteps guide ban_special_tokens end_at_limit force_prefix "
     "gather_rows write_column"),
    ("tokenizers.md", "Tokenizers: your text to the model's ids and back", tokenizers,
     "train_sentencepiece SentencePieceTokenizer sentencepiece_model_bytes SPECIAL_IDS"),
    ("training.md", "Training: schedule, optimizer, loss, metric", None,
     "TransformerSchedule transformer_optimizer LabelSmoothedCrossEntropy MaskedAccuracy"),
)  # fmt: skip
# The pipelines' pages: file, title, then `(module, public names)` in page order. The pipelines
# have no `__all__`; this is their public surface for scripts, and the reference's test keeps it
# current.
PIPELINE_PAGES = (
    ("pipelines-data.md", "Pipelines: data", (
        (tokenizer, "train_sentencepiece load_tokenizer load_tokenizers vocabulary_size"),
        (corpus, "iter_lines read_lines iter_parallel_lines read_parallel_files load_multi30k "
                 "load_tfds"),
        (batching, "make_dataset tokenize_examples batch_examples padding_efficiency"))),
    ("pipelines-training.md", "Pipelines: training", (
        (loading, "load_config"), (trainer, "Trainer"), (jax_trainer, "JaxTrainer"),
        (optimizers, "FusedAdam"),
        (checkpoints, "load_checkpoint average_checkpoints epoch_checkpoints"))),
    ("pipelines-export.md", "Pipelines: export", (
        (saved_model, "Translator export"), (ctranslate2, "convert CTranslate2Translator"))),
    ("pipelines-serving.md", "Pipelines: translating with an export or a model", (
        (client, "load_signature export_settings translate_lines call_in_batches "
                 "word_alignments"),
        (translation, "translate_strings score_strings"), (sampling, "sample_strings"),
        (evaluation, "translate score"))),
)  # fmt: skip
OURS = ("keras_transformer", "pipelines")  # the packages whose classes' members are documented
SECTION = re.compile(r"(Args|Call arguments|Fields|Raises|Returns|Examples?|References)( \(.*\))?:")
LISTED = {"Args", "Call arguments", "Fields", "Raises"}  # sections of `name: text` entries
SIZES = ("num_layers", "hidden_dim", "intermediate_dim", "num_heads", "dropout")


def _item(lines):
    """One `name: text` entry of an Args-like section as a bullet, its names in backticks."""
    text = " ".join(line.strip() for line in lines)
    name, _, rest = text.partition(": ")
    names = ", ".join(f"`{n.strip().strip('`')}`" for n in name.split(","))
    return f"- {names}: {rest}" if rest else f"- {text}"


def _closed(out, fence):
    """`out` without trailing blank lines, and the open code block closed."""
    while out and not out[-1].strip():
        out.pop()
    return out + (["```"] if fence else [])


def docstring_markdown(doc):
    """A Google-style docstring as Markdown: bold sections, bullets, `pycon` and `text` blocks."""
    out, section, items, fence = [], None, [], None
    for line in inspect.cleandoc(doc).splitlines():
        match = SECTION.fullmatch(line)
        indented = line.startswith("    ")
        if match:
            out = _closed(out + [_item(i) for i in items], fence)
            section, items = match.group(1), []
            fence = "pycon" if section.startswith("Example") else None
            out += ["", f"**{line[:-1]}**", ""] + ([f"```{fence}"] if fence else [])
        elif section in LISTED and line.strip():
            if re.match(r" {4}\S", line) and (not items or ":" in " ".join(items[-1])):
                items.append([line])  # a new entry (its names may wrap before the colon)
            elif items:
                items[-1].append(line)
        elif section in LISTED:
            out, items = out + [_item(i) for i in items] + [""], []
        elif section and fence != "pycon":
            out.append(line.strip())
        else:
            if section is None and indented != (fence == "text"):  # into or out of a block
                out = _closed(out, fence) + (["```text"] if indented else [])
                fence = "text" if indented else None
            listed = (out[-1] if out else "").startswith(("- ", "  "))  # a list ends here
            out += [""] if listed and fence is None and line[:2] not in ("- ", "  ", "") else []
            out.append(line[4:] if indented else line)
    return "\n".join(_closed(out + [_item(i) for i in items], fence))


def signature_block(name, obj):
    """`name(arguments)` in a code block, one argument a line when it is long."""
    parameters = [str(p) for n, p in inspect.signature(obj).parameters.items() if n != "self"]
    line = f"{name}({', '.join(parameters)})"
    if len(line) > 88:
        line = f"{name}(\n" + "".join(f"    {p},\n" for p in parameters) + ")"
    return f"```\n{re.sub(r' at 0x[0-9a-f]+', '', line)}\n```"


def _described(obj):
    """The object's own docstring (a class's, not its base's) as Markdown, or a note."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return docstring_markdown(doc) if doc else "*No docstring.*"


def members(cls):
    """`(name, object)` of the public methods and properties the package adds (not Keras's)."""
    ours = [k for k in cls.__mro__ if k.__module__.startswith(OURS)]
    outside = {name for k in cls.__mro__ if k not in ours for name in dir(k)}
    found = {}
    for klass in ours:
        for name, value in vars(klass).items():
            kind = inspect.isfunction(value) or isinstance(value, (property, classmethod))
            if kind and not name.startswith("_") and name not in outside:
                found.setdefault(name, value)
    return list(found.items())


def class_markdown(name, cls):
    """A class: its constructor, docstring, properties, then methods."""
    parts = [signature_block(name, cls), _described(cls)]
    properties = [(n, v) for n, v in members(cls) if isinstance(v, property)]
    if properties:
        lines = [f"- `{n}`: {' '.join(_described(v).split())}" for n, v in properties]
        parts.append("**Properties**\n\n" + "\n".join(lines))
    for method, value in members(cls):
        if not isinstance(value, property):
            function = getattr(cls, method)  # a classmethod bound, its docstring the function's
            parts += [f"### {name}.{method}", signature_block(method, function)]
            parts.append(_described(function))
    return "\n\n".join(parts)


def parameters_without_embeddings(sizes):
    """Weights of a default Transformer of these sizes but its embedding (None: other settings)."""
    if set(sizes) - set(SIZES):
        return None
    d, f, n = sizes["hidden_dim"], sizes["intermediate_dim"], sizes["num_layers"]
    attention, feed_forward, norm = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
    return n * (3 * attention + 2 * feed_forward + 5 * norm)  # an encoder and a decoder layer


def presets_markdown(presets):
    """The presets as a table: their sizes and parameter counts."""
    rows = [f"| preset | {' | '.join(SIZES)} | parameters besides the embedding |"]
    rows.append("|---" * (len(SIZES) + 2) + "|")
    for preset, sizes in presets.items():
        count = parameters_without_embeddings(sizes)
        shown = "" if count is None else f"{count:,} ({count / 1e6:.1f}M)"
        values = " | ".join(str(sizes.get(key, "")) for key in SIZES)
        rows.append(f"| `{preset}` | {values} | {shown} |")
    return (
        "Hyperparameters for `Transformer.from_preset(name, vocabulary_size, **overrides)`; "
        "the other arguments keep their defaults.\n\n" + "\n".join(rows) + "\n\n"
        "Add `vocabulary_size * hidden_dim` for the one embedding matrix that the source, the "
        "target and the output projection share by default."
    )


def entry_markdown(name, obj, paths):
    """One public name: heading, import paths, then its class, function or value."""
    if name == "PRESETS":
        body = presets_markdown(obj)
    elif inspect.isclass(obj):
        body = class_markdown(name, obj)
    elif callable(obj):
        body = signature_block(name, obj) + "\n\n" + _described(obj)
    else:
        body = f"A constant: `{name} = {obj!r}`."
    return f"## {name}\n\n{', '.join(f'`{path}`' for path in paths)}\n\n{body}\n"


HEADER = "<!-- Generated by `python -m pipelines.api_reference`; do not edit. -->\n\n"


def _index_row(file, title, group):
    links = ", ".join(f"[`{name}`]({file}#{name.lower()})" for name in group)
    return f"| [{title}]({file}) | {links} |"


def pipeline_pages():
    """`{file name: Markdown}` of the pipelines' pages, and their index rows."""
    pages, index = {}, []
    for file, title, groups in PIPELINE_PAGES:
        named = [(module, name) for module, names in groups for name in names.split()]
        missing = [f"{m.__name__}.{n}" for m, n in named if not hasattr(m, n)]
        if missing or len({n for _, n in named}) != len(named):
            raise ValueError(f"{file}: names missing {missing} or given twice")
        modules = "".join(f"- `{m.__name__}`: {m.__doc__.splitlines()[0]}\n" for m, _ in groups)
        entries = "\n".join(
            entry_markdown(name, getattr(m, name), [f"{m.__name__}.{name}"]) for m, name in named
        )
        pages[file] = f"{HEADER}# {title}\n\n{modules}\n{entries}"
        index.append(_index_row(file, title, [name for _, name in named]))
    return pages, index


def api_pages():
    """`{file name: Markdown}` for docs/api/: README.md, the index, and one page per group."""
    names = {}  # name: (object, [dotted paths])
    for module in MODULES:
        for name in module.__all__:
            paths = names.setdefault(name, (getattr(module, name), []))[1]
            paths.append(f"{module.__name__}.{name}")
    if sorted(name for *_, group in PAGES for name in group.split()) != sorted(names):
        raise ValueError(f"PAGES must place every public name once: {sorted(names)}")
    pages, index = {}, []
    for file, title, module, group in PAGES:
        group = group.split()
        intro = f"{docstring_markdown(module.__doc__)}\n\n" if module else ""
        entries = "\n".join(entry_markdown(name, *names[name]) for name in group)
        pages[file] = f"{HEADER}# {title}\n\n{intro}{entries}"
        index.append(_index_row(file, title, group))
    pipelines, pipeline_index = pipeline_pages()
    pages.update(pipelines)
    pages["README.md"] = (
        f"{HEADER}# API reference\n\n{docstring_markdown(keras_transformer.__doc__)}\n\n"
        "## keras_transformer\n\nThe layers, the model and the searches, on every backend.\n\n"
        "| page | public names |\n|---|---|\n" + "\n".join(index) + "\n\n"
        "## pipelines\n\nWhat a script of one's own calls from the TensorFlow pipelines "
        '(`pip install "keras-aiayn[tensorflow]"`; `JaxTrainer` needs `jax` too).\n\n'
        "| page | public names |\n|---|---|\n" + "\n".join(pipeline_index) + "\n"
    )
    return dict(sorted(pages.items()))


def main(folder="docs/api"):
    """Writes the pages into `folder` and names each with its size."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for file, text in api_pages().items():
        (folder / file).write_text(text, encoding="utf-8")
        print(f"{folder / file}: {len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
