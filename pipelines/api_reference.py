"""The API reference under docs/api/, made from the signatures and docstrings of keras_transformer.

Regenerate it from the repository root with `python -m pipelines.api_reference`;
a test checks that docs/api/ holds what this writes.
"""

import inspect
import pathlib
import re
import sys

import keras_transformer
from keras_transformer import decoding, layers, tokenizers

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
    ("decoding-helpers.md", "Decoding: constraints and the helpers the searches share", None,
     "BracketConstraint filter_log_probs IMPOSSIBLE prepare_search SearchSetup CachedSteps "
     "RecomputedSteps guide ban_special_tokens end_at_limit force_prefix gather_rows write_column"),
    ("tokenizers.md", "Tokenizers: your text to the model's ids and back", tokenizers,
     "train_sentencepiece SentencePieceTokenizer sentencepiece_model_bytes SPECIAL_IDS"),
    ("training.md", "Training: schedule, optimizer, loss, metric", None,
     "TransformerSchedule transformer_optimizer LabelSmoothedCrossEntropy MaskedAccuracy"),
)  # fmt: skip
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
    ours = [k for k in cls.__mro__ if k.__module__.startswith("keras_transformer")]
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


def api_pages():
    """`{file name: Markdown}` for docs/api/: README.md, the index, and one page per group."""
    names = {}  # name: (object, [dotted paths])
    for module in MODULES:
        for name in module.__all__:
            paths = names.setdefault(name, (getattr(module, name), []))[1]
            paths.append(f"{module.__name__}.{name}")
    if sorted(name for *_, group in PAGES for name in group.split()) != sorted(names):
        raise ValueError(f"PAGES must place every public name once: {sorted(names)}")
    header = "<!-- Generated by `python -m pipelines.api_reference`; do not edit. -->\n\n"
    pages, index = {}, []
    for file, title, module, group in PAGES:
        group = group.split()
        intro = f"{docstring_markdown(module.__doc__)}\n\n" if module else ""
        entries = "\n".join(entry_markdown(name, *names[name]) for name in group)
        pages[file] = f"{header}# {title}\n\n{intro}{entries}"
        links = ", ".join(f"[`{name}`]({file}#{name.lower()})" for name in group)
        index.append(f"| [{title}]({file}) | {links} |")
    pages["README.md"] = (
        f"{header}# API reference\n\n{docstring_markdown(keras_transformer.__doc__)}\n\n"
        "| page | public names |\n|---|---|\n" + "\n".join(index) + "\n"
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
