"""Where a run's vocabulary files are: one SentencePiece model, or one a side.

A run trained here has one vocabulary for both sides (section 5.1):
`sentencepiece.model`. An imported model may segment each side with its own
SentencePiece model (Marian's `source.spm` and `target.spm`): the target's
is then `sentencepiece.target.model` beside it, and every reader of targets
(training data, scoring, prefixes, the outputs' detokenization) takes it.
"""

import os


def target_vocabulary_path(model_path):
    """The SentencePiece file of the target side of the run whose vocabulary is `model_path`.

    Args:
        model_path: str, the run's (source or shared) `.model` file.

    Returns:
        str: `NAME.target.model` beside `model_path` where the run has one,
        else `model_path` itself.
    """
    base, extension = os.path.splitext(model_path)
    target = f"{base}.target{extension}"
    return target if os.path.exists(target) else model_path
