"""`kt`: the one command, with a subcommand for everything a user runs.

    kt train --recipe multi30k --multi30k-dir data/multi30k
    kt export --run-dir runs/multi30k --name multi30k
    kt translate --model saved_models/multi30k --input test.en --output test.de

`python -m pipelines COMMAND ...` is the same. `kt --help` lists the
commands; `kt COMMAND --help` shows one command's flags.
"""

import ast
import importlib
import importlib.util
import os
import sys
import tempfile

# Subcommand -> the module whose `main(argv, prog)` runs it.
COMMANDS = {
    "train": "pipelines.commands.train",
    "average": "pipelines.commands.average",
    "export": "pipelines.commands.export",
    "translate": "pipelines.commands.translate",
    "score": "pipelines.commands.score",
    "evaluate": "pipelines.commands.evaluate",
    "parse": "pipelines.commands.parse",
    "parseval": "pipelines.commands.parseval",
    "attention": "pipelines.commands.attention",
    "ct2-export": "pipelines.commands.ctranslate2_export",
    "import": "pipelines.commands.import_model",
    "data-service": "pipelines.commands.data_service",
    "demo": "pipelines.commands.demo",
}
# Commands that never import TensorFlow (scoring text files).
WITHOUT_TENSORFLOW = {"evaluate", "parseval"}


def summary(module_name):
    """The first line of a command module's docstring, read without importing it."""
    path = importlib.util.find_spec(module_name).origin
    with open(path, encoding="utf-8") as handle:
        return ast.get_docstring(ast.parse(handle.read())).splitlines()[0]


def usage():
    """`kt --help`: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(module)}" for name, module in COMMANDS.items()]
    return "usage: kt COMMAND [--help] ...\n\ncommands:\n" + "\n".join(lines) + "\n"


def import_tensorflow_quietly():
    """Imports TensorFlow with its start-up lines kept off the terminal.

    TensorFlow and XLA log through absl at import (oneDNN, CUDA drivers),
    whatever TF_CPP_MIN_LOG_LEVEL says; those lines would stand before a
    command's own output and errors. They are written to a temporary file
    instead, shown only if the import fails.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # device start-up logs here
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main(argv=None):
    """Runs `kt COMMAND ...`.

    Args:
        argv: list of str, the arguments after `kt` (default: `sys.argv[1:]`).

    Returns:
        int, the exit status: 0, or 2 for bad input (one `error:` line).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; one of {list(COMMANDS)}", file=sys.stderr)
        return 2
    if name not in WITHOUT_TENSORFLOW:  # `--help` too: `kt train --help` reads the settings
        import_tensorflow_quietly()
    return importlib.import_module(COMMANDS[name]).main(rest, prog=f"kt {name}")
