"""Learning from what backends report: the index is an estimate, the backend is the truth.

The gateway's tokens are not the backend's, so predictions and reports are compared as
SHARES of the prompt: the backend's ``cached_tokens / prompt_tokens`` translated into a
number of gateway blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.flow import PrefixKey
from gateway.index.base import PrefixIndex


@dataclass(slots=True, frozen=True)
class Feedback:
    predicted_blocks: int
    held_blocks: int
    """Gateway blocks the backend evidently held before the call, from its report."""
    reported: bool

    @property
    def overestimated(self) -> bool:
        return self.reported and self.held_blocks < self.predicted_blocks


def observe(
    index: PrefixIndex,
    model: str,
    backend: str,
    key: PrefixKey,
    predicted_blocks: int,
    reported_cached: int | None,
    reported_prompt: int | None,
    holds: PrefixKey | None = None,
) -> Feedback:
    """Correct the index after a call to ``backend``; returns the comparison for metrics.

    Call it once per upstream call, after ``index.record`` at dispatch (which lets
    concurrent calls with a new prefix follow the first one):

    - The backend reported usage, so it prefilled the prompt and holds all of it now,
      whatever it held before: the handles are renewed, never cut (with ``holds``, the
      prompt and its reply from ``PrefixHasher.reply_key``, the reply's blocks too).
      Cutting them to the reported share would send the conversation's next turn
      elsewhere, to a backend that holds none of it. A shortfall is returned
      (``overestimated``) for the accuracy metrics.
    - No usage (the call failed before prefill): the dispatch record is withdrawn down to
      what the index predicted before the call.
    """
    if reported_prompt is None or reported_prompt <= 0:
        index.forget(model, backend, key.hashes, predicted_blocks)
        return Feedback(predicted_blocks, 0, reported=False)
    index.record(model, backend, (holds or key).hashes)
    held = held_blocks(key, reported_cached or 0, reported_prompt)
    return Feedback(predicted_blocks, held, reported=True)


def held_blocks(key: PrefixKey, reported_cached: int, reported_prompt: int) -> int:
    """The backend's cached share of its prompt, as whole gateway blocks of this prompt."""
    share = min(max(reported_cached / reported_prompt, 0.0), 1.0)
    return min(int(share * key.tokens) // key.block_size, len(key.hashes))
