"""The end of a run's held-out evaluation: which split, its greedy decode and its scores."""

import logging
import os

from pipelines.data import tokenizer
from pipelines.evaluation import score, translate
from pipelines.files import atomic_text
from pipelines.parsing import trees
from pipelines.parsing.corpus import (
    bracket_constraint,
    parse_scores,
    treebank_pairs,
    vocabulary_tags,
)
from pipelines.training.checkpoints import with_dtype_policy

logger = logging.getLogger(__name__)


def is_parser(config):
    """Whether the run trains a parser (targets are linearised trees)."""
    return config.data.corpus == "ptb"


def tree_words(config):
    """Whether the run's targets are trees that write each word before its tag."""
    return is_parser(config) and config.data.treebank_words


def heldout_pairs(config, validation_pairs, test_pairs):
    """`(pairs, split)` the end-of-run evaluation decodes (`output.heldout_split`).

    `split` is "test" or "validation"; pairs are None for "none". A study
    that chooses settings on validation sets "validation", so its runs never
    decode the test split.

    Args:
        config: the run's `TrainConfig`.
        validation_pairs: list of `(source, target)` str pairs, a
            `tf.data.Dataset` of them, or None.
        test_pairs: the same for the test split, or None (no test split).

    Returns:
        `(pairs or None, str)`.
    """
    chosen = config.output.heldout_split
    if chosen == "test" and test_pairs is not None:
        return test_pairs, "test"
    return (None if chosen == "none" else validation_pairs), "validation"


def heldout_scores(config, out_dir, model, evaluation, split):
    """Decodes the held-out `evaluation` pairs greedily; their BLEU (or parse F1) and examples.

    Also writes them as `heldout.source` and `heldout.target` (and a
    parser's gold `heldout.trees`), for `kt translate` and `kt evaluate`.

    Args:
        config: the run's `TrainConfig`.
        out_dir: str, the run's folder (with its `sentencepiece.model`).
        model: the trained `Transformer` (computing in float32 for the decode).
        evaluation: list of `(source, target)` str pairs.
        split: str, "test" or "validation", as `heldout_pairs` names it.

    Returns:
        dict: `heldout_split`, `greedy_bleu` and `bleu_signature` (a
        parser: `greedy_parse`), and five `examples`.
    """
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    sources, targets = [s for s, _ in evaluation], [t for _, t in evaluation]
    for name, texts in (("heldout.source", sources), ("heldout.target", targets)):
        with atomic_text(os.path.join(out_dir, name)) as handle:
            handle.writelines(f"{text}\n" for text in texts)
    constraint = None
    if config.decoding.tree_constraint:
        constraint = bracket_constraint(spm_path, model.eos_id, tree_words(config))
    hypotheses = translate(
        with_dtype_policy(model, "float32"),  # as `kt export` decodes a mixed-precision run
        tokenizer.load_tokenizers(spm_path),
        sources,
        max_source_length=config.batching.max_length,
        extra_length=config.decoding.extra_length,
        constraint=constraint,
    )
    result = {"heldout_split": split}
    if is_parser(config):  # parses: labelled F1 against the gold trees
        tree_split = "test" if split == "test" else "dev"  # the treebank's names
        _, gold = treebank_pairs(config.data.treebank_dir, tree_split)
        # The tags the vocabulary keeps whole, as `kt parse` reads them from an export.
        tags = vocabulary_tags(spm_path)
        scores = parse_scores(hypotheses, gold, tags, tree_words(config))
        result["greedy_parse"] = {"split": tree_split, **scores}
        with atomic_text(os.path.join(out_dir, "heldout.trees")) as handle:
            handle.writelines(f"{trees.to_bracketed(tree)}\n" for tree in gold)
    else:
        scores = score(hypotheses, targets)
        result["greedy_bleu"], result["bleu_signature"] = scores["bleu"], scores["bleu_signature"]
    result["examples"] = [
        {"source": s, "translation": h, "reference": t}
        for (s, t), h in list(zip(evaluation, hypotheses, strict=True))[:5]
    ]
    return result


def validation_scorer(config, out_dir, validation_pairs):
    """A function scoring the model on the first `output.validation_sentences` validation pairs.

    The run's validation decode: greedy (or `output.validation_beam`, with
    the export's `alpha`), sacreBLEU's BLEU and chrF against the references.

    Args:
        config: the run's `TrainConfig`.
        out_dir: str, the run's folder (with its `sentencepiece.model`).
        validation_pairs: list of `(source, target)` str pairs, or None.

    Returns:
        function from a `Transformer` to `{"bleu": float, "chrf": float}`,
        or None where the run scores no validation decode.
    """
    count = config.output.validation_sentences
    if count and config.data.corpus == "files" and not config.data.validation_files:
        logger.warning(
            "validation_sentences %d: the run has no validation data (--validation-files), "
            "so no BLEU while it trains", count
        )  # fmt: skip
    if not count or not validation_pairs:
        return None
    pairs = list(validation_pairs)[:count]
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    tokenizers = tokenizer.load_tokenizers(os.path.join(out_dir, "sentencepiece.model"))

    def scores(model):
        hypotheses = translate(
            with_dtype_policy(model, "float32"),
            tokenizers,
            sources,
            max_source_length=config.batching.max_length,
            beam_size=config.output.validation_beam,
            alpha=config.decoding.alpha,
            extra_length=config.decoding.extra_length,
        )
        result = score(hypotheses, targets)
        return {"bleu": result["bleu"], "chrf": result["chrf"]}

    return scores
