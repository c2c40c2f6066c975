"""Rehearsal memory: the note the policy writes from its imagined episodes (docs/method.md §5).

After private rehearsal the policy condenses what it imagined into a short memory — what failed,
what the results looked like, a plan — and the committed episode gets that memory in its context.
Choices (docs/rehearsal.md):

* The memory is a *policy generation*: a fresh two-message chat
  (``rollout.memory_prompts.memory_messages``, rendered there so SFT can use the same text) over
  condensed transcripts of the imagined episodes, sampled by the same sampler and weights as the
  agent, capped at ``MemoryConfig.max_new_tokens``. Its sampled ids are kept (``MemoryNote``).
* Transcripts show what the agent *saw* in imagination: each call with its rehearsed result (or
  the structured error), the final answers and the stop reason. Nothing real is in them.
* Sequential rehearsal updates the memory after every imagined episode: memory ``k`` is written
  from memory ``k-1`` plus the transcript of episode ``k``, so the prompt stays short.
* The committed episode carries the memory in the task's context text (``with_memory`` appends
  it to ``Task.system``), which the act prompt renders at the head of the first user message,
  after the task's own context and before the request (``prompts.first_user_text``). A task
  copy is all it takes: no rollout hook, and the shared system message (tools, examples) keeps
  its token prefix, so prefix reuse still applies to committed batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.config import MEMORY_TOKENS
from envace_engine.rollout.prompts import Message
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler, SamplingParams
from envace_engine.types import Episode, MetaKey, Role


@dataclass(frozen=True)
class MemoryConfig:
    """How memories are written: token cap of one memory and of each transcript in its prompt."""

    max_new_tokens: int = MEMORY_TOKENS
    transcript_chars: int = 1500  # per imagined episode; longer transcripts keep their end
    temperature: float | None = None  # None: the rollout's temperature

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"MemoryConfig.max_new_tokens={self.max_new_tokens}: use >= 1")
        if self.transcript_chars < 100:
            raise ValueError(
                f"MemoryConfig.transcript_chars={self.transcript_chars}: use >= 100 characters"
            )


@dataclass(frozen=True)
class MemoryNote:
    """One sampled memory: its text (without the stop token), ids and how the generation ended.

    ``finish_reason`` follows ``Generation``; on ``abort``/``error`` (or a prompt that does not fit
    the context) ``text`` is empty, ``error`` says why, and the committed episode runs without it.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"
    error: str = ""

    @property
    def n_tokens(self) -> int:
        """Sampled tokens (what a memory costs)."""
        return len(self.token_ids)

    def as_meta(self) -> dict[str, Any]:
        """A JSON-ready record for ``Episode.meta``."""
        return {
            "text": self.text,
            "n_tokens": self.n_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "token_ids": list(self.token_ids),
        }


def sampled_tokens(episode: Episode) -> int:
    """Policy tokens an episode sampled (act + rehearse), from the rollout's own count."""
    counted = episode.meta.get(MetaKey.SAMPLED_TOKENS)
    if isinstance(counted, int):
        return counted
    act = sum(len(s.token_ids) for s in episode.segments if s.role is Role.ACT)
    return act + sum(len(r.completion.token_ids) for r in episode.rehearsals)


def write_memories(
    sampler: Sampler,
    chat: ChatTokenizer,
    prompts: Sequence[list[Message]],
    params: SamplingParams,
    context_limit: int,
) -> list[MemoryNote]:
    """Sample one memory per prompt in one batched call; failures become empty notes."""
    encoded = [chat.prompt_ids(messages) for messages in prompts]
    fits = [len(ids) + params.max_new_tokens <= context_limit for ids in encoded]
    batch = [ids for ids, ok in zip(encoded, fits, strict=True) if ok]
    gens = iter(sampler.generate(batch, params) if batch else [])
    notes: list[MemoryNote] = []
    for ids, ok in zip(encoded, fits, strict=True):
        if not ok:
            notes.append(
                MemoryNote(
                    "",
                    (),
                    "error",
                    f"memory prompt of {len(ids)} tokens "
                    f"does not fit context_limit={context_limit}",
                )
            )
            continue
        gen = next(gens)
        if gen.finish_reason in ("abort", "error"):
            notes.append(MemoryNote("", tuple(gen.token_ids), gen.finish_reason, gen.error))
            continue
        notes.append(
            MemoryNote(_plain_text(chat, gen.token_ids), tuple(gen.token_ids), gen.finish_reason)
        )
    return notes


def _plain_text(chat: ChatTokenizer, ids: Sequence[int]) -> str:
    """Memory text safe to put inside a chat message: no special tokens, not even as text.

    The memory is rendered into the committed prompt; a special token in it (sampled, or spelled
    out) would re-tokenise as a real ``<|im_start|>`` and break the chat structure.
    """
    text = chat.tokenizer.decode(list(ids), skip_special_tokens=True)
    for special in getattr(chat.tokenizer, "all_special_tokens", ()):
        text = text.replace(special, "")
    return text.strip()
