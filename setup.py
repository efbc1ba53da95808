"""keras-aiayn: the Transformer of "Attention Is All You Need" for Keras 3.

The distribution is keras-aiayn; the import package is keras_transformer.
"""

import re

from setuptools import find_packages, setup

REPOSITORY = "https://github.com/keras-transformer/keras-transformer"


def long_description():
    """README.md with its relative links made absolute, so that they work on PyPI."""
    text = open("README.md", encoding="utf-8").read()
    return re.sub(r"\]\((?!https?:|#|mailto:)([^)]+)\)", rf"]({REPOSITORY}/blob/main/\1)", text)


CORE = ["keras>=3.10,<4", "numpy>=1.26"]
TENSORFLOW = [
    "tensorflow>=2.21,<2.22",
    "tensorflow-text>=2.21,<2.22",
    "tensorflow-datasets>=4.9,<5",
    "sacrebleu>=2.4,<3",
    "sentencepiece>=0.2,<0.3",
    "babel>=2.14,<3",
    "tensorboard>=2.20",
    "matplotlib>=3.8",
    # PredictionLog protos for the export's TF Serving warm-up file; the gRPC client.
    "tensorflow-serving-api>=2.21,<2.22",
    # Penn Treebank reading for the parsing task (BracketParseCorpusReader, Tree).
    "nltk>=3.8,<4",
    # `kt import marian`: Hugging Face weights and Hub downloads (no transformers needed).
    "safetensors>=0.4",
    "huggingface-hub>=0.23",
]

setup(
    name="keras-aiayn",
    version="0.2.0",
    license="Apache-2.0",
    author="The keras-transformer authors",
    description=(
        'The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) '
        "as Keras 3 layers, with TensorFlow pipelines for training and TF Serving."
    ),
    long_description=long_description(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    url=REPOSITORY,
    project_urls={
        "Documentation": f"{REPOSITORY}/tree/main/docs",
        "Changelog": f"{REPOSITORY}/blob/main/CHANGELOG.md",
        "Issues": f"{REPOSITORY}/issues",
    },
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    keywords=["keras", "transformer", "machine translation", "attention", "tensorflow"],
    packages=find_packages(include=["keras_transformer*", "pipelines*"]),
    # The layers, model, losses and decoding need Keras and one backend only
    # (TensorFlow, JAX or PyTorch, installed by the user).
    install_requires=CORE,
    entry_points={"console_scripts": ["kt=pipelines.cli:main"]},
    package_data={"pipelines.training": ["recipes/*.json"]},
    extras_require={
        # The TensorFlow pipelines: data, training, export, serving, commands.
        "tensorflow": TENSORFLOW,
        "ctranslate2": ["ctranslate2>=4.5,<5"],
        # `keras_transformer.tokenizers` on its own (the TensorFlow extra has it too).
        "tokenizers": ["sentencepiece>=0.2,<0.3"],
        "test": TENSORFLOW
        + [
            "keras-hub>=0.21,<1",
            "pytest>=8",
            "pytest-xdist>=3.5",
            "ruff>=0.6",
            "jax[cpu]>=0.4.30",
            # The third Keras backend the layer tests run under (CPU is enough).
            "torch>=2.4",
            "ctranslate2>=4.5,<5",
            # The reference the Marian import is checked against.
            "transformers>=4.44",
            # The release check: an sdist and a wheel that PyPI accepts.
            "build>=1.2",
            "twine>=5",
        ],
    },
)
