"""The README's install line on a fresh machine, and the size limits of the docs."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def clean_copy(folder):
    """The repository's tracked files copied into `folder`, as a fresh clone has them."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


@pytest.mark.slow  # a virtual environment and keras, numpy and their dependencies from PyPI
def test_pip_install_gives_kt_and_this_keras_transformer(tmp_path):
    """`pip install .` from a clean copy into a fresh virtual environment (no site packages)."""
    source = clean_copy(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    assert (venv / "bin" / "kt").exists()
    # Where `import keras_transformer` resolves, without importing Keras (the venv has no
    # backend: the core leaves its choice to the user).
    check = (
        "import importlib.metadata as m, importlib.util as u; "
        "print(u.find_spec('keras_transformer').origin); "
        "print(m.distribution('keras-aiayn').version); "
        "print(sorted(m.packages_distributions()['keras_transformer']))"
    )
    result = subprocess.run(
        [str(python), "-c", check], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    location, version, owners = result.stdout.strip().splitlines()
    assert location.startswith(str(venv)) and "site-packages" in location
    installed = pathlib.Path(location).parent / "layers" / "attention.py"
    assert (
        installed.read_text()
        == (ROOT / "keras_transformer" / "layers" / "attention.py").read_text()
    )
    assert version and owners == "['keras-aiayn']"  # this package, and no other one provides it


def test_the_docs_stay_within_their_sizes():
    """README at most 10 KB, each user page 15 KB, the benchmark record 20 KB (bytes)."""
    limits = {ROOT / "README.md": 10_000, ROOT / "benchmarks" / "README.md": 20_000}
    limits.update({page: 15_000 for page in (ROOT / "docs").rglob("*.md")})
    over = {
        str(p.relative_to(ROOT)): p.stat().st_size
        for p, n in limits.items()
        if p.stat().st_size > n
    }
    assert not over, over


@pytest.mark.slow  # builds, then installs TensorFlow and the pipelines into a fresh environment
@pytest.mark.release
def test_the_release_builds_passes_twine_and_runs_kt_from_the_wheel(tmp_path):
    """The release checklist's checks: `python -m build` gives an sdist and a wheel built from
    it, `twine check --strict` accepts both, and the wheel with its `tensorflow` extra runs
    `kt demo` in a fresh virtual environment, away from the repository."""
    import tarfile
    import zipfile

    source, dist = clean_copy(tmp_path / "clone"), tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0 and check.stdout.count("PASSED") == 2, check.stdout
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {"pipelines/training/recipes/default.json", "keras_transformer/__init__.py"} <= set(
        names
    )
    assert not [n for n in names if n.startswith("tests/")]
    assert "](docs/" not in metadata  # the README's links work on PyPI
    with tarfile.open(sdist) as archive:
        tops = {name.split("/")[1] for name in archive.getnames() if "/" in name}
    assert {"keras_transformer", "pipelines", "README.md", "LICENSE", "CHANGELOG.md"} <= tops
    assert "tests" not in tops

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[tensorflow]"],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    tiny = ["--set", "default_corpus_sizes=[1500,40,40]", "--set", "model.num_layers=1",
            "--set", "model.hidden_dim=32", "--set", "model.intermediate_dim=64",
            "--set", "vocabulary_size=200", "--set", "steps=10"]  # fmt: skip
    environment = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work)}
    demo = subprocess.run(
        ["kt", "demo", "--output-dir", "run", "--base", "exports", "--examples", "1", *tiny],
        cwd=work, env=environment, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (work / "exports" / "default" / "1" / "saved_model.pb").is_file()
    assert "Held-out BLEU" in demo.stdout
