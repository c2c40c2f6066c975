"""Test-time ``select`` rehearsal: commit the first reply of the imagined episode that looks best.

The ``parallel`` and ``sequential`` modes hand the committed episode a *memory* written from the
imagined episodes, which only helps a policy that has learnt to read one. ``select`` uses the
imagined episodes without putting anything new in the policy's context: of the task's N imagined
episodes (one batched rollout, as in ``parallel``) it picks the one whose rehearsed outcome looks
best to the agent itself, and the committed real episode starts with that episode's first reply,
replayed token for token (``rollout.loop._Runner.replay``); every later reply is sampled as in
plain execution. The first prompt of an imagined episode and of the committed one is the same
(same task, tools and worked examples, no memory), so the replayed reply is a sample of the same
policy after the same prompt — chosen among N by what the agent imagined would follow it.

**How an imagined episode looks** (``Outlook``, compared in this order; nothing real is used):

1. ``finished``: it reached a final answer (stop reason ``done``), rather than ending on a
   malformed or truncated reply or a turn, token or context limit;
2. ``errors``: fewer tool results shown to the agent that were errors (as the policy's world
   role wrote them, or as the schema check refused the call with ``check_calls``; an
   unparseable rehearsal counts as one);
3. ``confidence``: higher mean log-prob per act token the policy sampled in it.

Ties go to the earlier episode. An imagined episode without a sampled first reply (a sampler
error) is never chosen; when none has one, the committed episode samples its own first reply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from envace_engine.types import Episode, Replay, Role, StopReason


@dataclass(frozen=True)
class Outlook:
    """How an imagined episode looks to the agent that imagined it (see the module docstring)."""

    finished: bool
    errors: int
    confidence: float | None  # None: the episode sampled no act token

    def key(self) -> tuple[bool, int, float]:
        """Larger is better."""
        confidence = -math.inf if self.confidence is None else self.confidence
        return (self.finished, -self.errors, confidence)

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)


def outlook(episode: Episode) -> Outlook:
    """The imagined episode's outlook, from its stop reason, rehearsals and act log-probs."""
    errors = sum(1 for c in episode.calls if (seen := c.seen()) is None or not seen.ok)
    logprobs = [
        lp for s in episode.segments if s.role is Role.ACT and s.logprobs for lp in s.logprobs
    ]
    confidence = sum(logprobs) / len(logprobs) if logprobs else None
    return Outlook(episode.stop_reason is StopReason.DONE, errors, confidence)


def first_reply(episode: Episode) -> Replay | None:
    """The episode's first act segment and the prompt before it, or None when it has none."""
    prompt: list[int] = []
    for segment in episode.segments:
        if segment.role is Role.ACT:
            return Replay(tuple(prompt), segment) if segment.logprobs is not None else None
        prompt += segment.token_ids
    return None


def choose(imagined: Sequence[Episode]) -> int | None:
    """Index of the best-looking imagined episode with a first reply (earliest on ties)."""
    candidates = [i for i, e in enumerate(imagined) if first_reply(e) is not None]
    if not candidates:
        return None
    keys = {i: outlook(imagined[i]).key() for i in candidates}
    return max(candidates, key=lambda i: (keys[i], -i))
