"""Greedy search, beam search (section 6.1) and sampling on `ops.while_loop`.

Both searches run a whole batch at once and step a decoder through the
interface `Transformer.start_decoding` / `Transformer.decoding_step`. Each
sentence may produce at most its own source length plus `extra_length` tokens
(50 in the paper), so padding a batch changes no result.

How the decoder state is carried depends on `static_shapes`:
- dynamic shapes (the default on TensorFlow and PyTorch): self-attention caches
  grow by one position a step, and sentences that are done leave the batch
  (beam search's at once; greedy search's and sampling's rows once a
  sixteenth of them have finished, masked until then), so a step costs about
  what its live hypotheses need;
- static shapes (the default on JAX, whose `jit` needs them): caches are
  fixed-size buffers as long as the longest output, and finished rows ride
  along, masked, until the whole batch is done.
Both give the same results (tested).

With `use_cache=False` every step recomputes the whole prefix instead
(`RecomputedSteps`), the slow reference the cached decoders are checked and
measured against.

Hypotheses are scored by their log-probability divided by a length penalty:
GNMT's `((5 + |Y|) / 6) ** alpha` (Wu et al., 2016) by default, or
`|Y| ** alpha` (`penalty_form="power"`, as `transformers` and CTranslate2
divide), where `|Y|` counts the produced tokens, end-of-sequence included.
`pad_id` and `bos_id` are never produced.
"""

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.constraints import BracketConstraint
from keras_transformer.decoding.controls import DecodingControls
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.sampling import filter_log_probs, sample
from keras_transformer.decoding.steps import (
    IMPOSSIBLE,
    PENALTY_FORMS,
    CachedSteps,
    RecomputedSteps,
    SearchSetup,
    ban_special_tokens,
    end_at_limit,
    force_prefix,
    gather_rows,
    guide,
    length_penalty,
    prepare_search,
    score_hypotheses,
    write_column,
)

__all__ = [
    "BracketConstraint",
    "IMPOSSIBLE",
    "PENALTY_FORMS",
    "CachedSteps",
    "DecodingControls",
    "RecomputedSteps",
    "SearchSetup",
    "ban_special_tokens",
    "end_at_limit",
    "filter_log_probs",
    "force_prefix",
    "beam_search",
    "gather_rows",
    "guide",
    "greedy_search",
    "length_penalty",
    "prepare_search",
    "sample",
    "score_hypotheses",
    "write_column",
]
