"""The README's install line on a fresh machine, and the size limits of the docs."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a virtual environment and keras, numpy and their dependencies from PyPI
def test_pip_install_gives_kt_and_this_keras_transformer(tmp_path):
    """`pip install .` from a clean copy into a fresh virtual environment (no site packages)."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    source = tmp_path / "clone"
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
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
