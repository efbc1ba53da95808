"""The product's stages as a user runs them: each command in its own process.

`kt demo` and `benchmarks/multi30k_recipe.py` both train, then export,
translate with the SavedModel (in a process that loads only TensorFlow and the
export) and score; they share these functions.
"""

import json
import os
import subprocess
import sys
import time

from pipelines.errors import UsageError


def run_stage(title, command, arguments, env=None):
    """Runs `kt command *arguments` in a fresh process and times it.

    Args:
        title: str, printed above the command.
        command: str, a `kt` command, e.g. "train".
        arguments: list of str.
        env: dict or None, the process environment (default: this one's).

    Returns:
        float, wall-clock seconds.

    Raises:
        UsageError: the command exited with a non-zero status (its own error
            message is already on stderr).
    """
    print(f"\n== {title}\n$ kt {command} {' '.join(arguments)}", flush=True)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pipelines", command, *arguments], env=env)
    if result.returncode != 0:
        raise UsageError(f"{title} failed (exit {result.returncode})")
    return round(time.perf_counter() - started, 1)


def export_translate_score(run_dir, export_dir, source, reference, prefix, env=None, **options):
    """Exports `run_dir`, translates `source` with the SavedModel, scores it.

    Args:
        run_dir: str, a training output folder.
        export_dir: str, the model's folder (`BASE/NAME`); a new version is added.
        source, reference: str, aligned text files.
        prefix: str, outputs go to `{prefix}.translation` and the scores to
            `{prefix}.scores.json` (cased) and `{prefix}.scores.lowercased.json`.
        env: dict or None, the processes' environment.
        **options: `beam_size` (4), `alpha` (0.6), `lowercase` (also score
            lowercased text, False), `signatures` (list of str: export these
            only, `translate` among them; None: all).

    Returns:
        `(seconds, scores)`: dicts keyed by stage, and by "cased" /
        "lowercased" holding `pipelines.evaluation.score` results.
    """
    beam_size = str(options.get("beam_size", 4))
    beam = ["--beam-size", beam_size, "--alpha", str(options.get("alpha", 0.6))]
    base, name = os.path.split(os.path.normpath(export_dir))
    chosen = options.get("signatures")
    flags = [*beam, "--nbest", beam_size, *([] if chosen is None else ["--signatures", *chosen])]
    seconds = {
        "export": run_stage(
            "Export a SavedModel for TF Serving",
            "export",
            # `nbest` returns every hypothesis of the beam.
            ["--run-dir", run_dir, "--base", base, "--name", name, *flags],
            env,
        )
    }
    translation = f"{prefix}.translation"
    seconds["translate"] = run_stage(
        "Translate with the SavedModel",
        "translate",
        ["--model", export_dir, "--input", source, "--output", translation, *beam],
        env,
    )
    cases = {"cased": ([], f"{prefix}.scores.json")}
    if options.get("lowercase"):
        cases["lowercased"] = (["--lowercase"], f"{prefix}.scores.lowercased.json")
    scores = {}
    for case, (flags, path) in cases.items():
        arguments = ["--hypotheses", translation, "--references", reference, "--output", path]
        run_stage(f"Score it with sacreBLEU ({case})", "evaluate", arguments + flags, env)
        scores[case] = _read_json(path)
    return seconds, scores


def _read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
