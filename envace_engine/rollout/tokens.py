"""Token-in/token-out sequences: the agent context as sampled ids plus tokenised external text.

The rollout never re-tokenises what the policy sampled. The agent context grows by two kinds of
appends only:

* sampled tokens (``act``), exactly as the sampler returned them, with their log-probs;
* external text (tool results, later user turns), of which only the *new suffix* is tokenised.

The suffix is cut so that it starts right after a special token: after an act reply that ended
with ``<|im_end|>`` it is ``"\\n<|im_start|>tool\\n…<|im_end|>\\n<|im_start|>assistant\\n"``;
after a reply cut by ``max_new_tokens`` it starts with the end token itself. Special tokens
split the text before BPE runs, so the suffix's tokens are the same alone as in the full render.

Every new prompt is also compared with a tokenisation of the full re-rendered chat, with each
sampled segment replaced by the canonical tokenisation of its own text; each mismatch counts one
``drift`` (reported as a metric): the builder's ids are not what the template would give, i.e.
a segment boundary merged or the template is not prefix-stable. Separately, a sampled reply
whose ids are not the canonical tokenisation of its text (the policy sampled ``"print",
"able"`` where the tokenizer would write ``"printable"``) counts as ``noncanonical``: that is
legitimate sampling, and exactly why sampled ids are never re-tokenised. The sampled ids always
win. Layout and masks: docs/masking.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envace_engine.rollout.prompts import Message, render
from envace_engine.types import Episode, Rehearsal, Role, Segment, TrainRow

# role_mask values: which role (if any) a token is trained for.
MASK_NONE = 0
MASK_ACT = 1
MASK_REHEARSE = 2
_SENTINEL = "\u2063ENVACE_SENTINEL\u2063"  # content marker for finding the template's closing text


class TokenSequence:
    """The agent context being built: segments plus the flat ids, extended together."""

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._ids: list[int] = []

    @property
    def ids(self) -> list[int]:
        """All token ids so far (the next prompt, once a generation prompt is appended)."""
        return self._ids

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments so far, in order."""
        return tuple(self._segments)

    def append(
        self,
        role: Role,
        token_ids: Sequence[int],
        text: str,
        logprobs: Sequence[float] | None = None,
    ) -> None:
        """Append one segment. Sampled roles need one log-prob per token; others none."""
        sampled = role.trained
        if sampled and (logprobs is None or len(logprobs) != len(token_ids)):
            got = "none" if logprobs is None else len(logprobs)
            raise ValueError(f"{role} segment: {len(token_ids)} tokens but {got} logprobs")
        if not sampled and logprobs is not None:
            raise ValueError(f"{role} segment is external text and cannot carry logprobs")
        ids = tuple(int(t) for t in token_ids)
        lps = None if logprobs is None else tuple(float(x) for x in logprobs)
        self._segments.append(Segment(role=role, token_ids=ids, text=text, logprobs=lps))
        self._ids.extend(ids)


class ChatTokenizer:
    """Renders chats with the model's template and tokenises only what is new."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.convert_ids_to_tokens(self.eos_id)

    def encode(self, text: str) -> list[int]:
        """Tokenise text that already holds the template's special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """Exact text of sampled ids (special tokens kept, no space clean-up)."""
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """A fresh prompt: the whole chat rendered with a generation prompt."""
        return self.encode(render(self.tokenizer, messages, add_generation_prompt=True))

    def closing_text(self, history: Sequence[Message]) -> str:
        """What the template writes after an assistant message (e.g. ``<|im_end|>\\n``)."""
        marked = [*history, Message("assistant", _SENTINEL)]
        text = render(self.tokenizer, marked, add_generation_prompt=False)
        return text[text.rfind(_SENTINEL) + len(_SENTINEL) :]

    def suffix(
        self, history: Sequence[Message], reply: Message, new: Sequence[Message], stopped: bool
    ) -> str:
        """External text after a sampled ``reply`` up to the next generation prompt.

        ``history`` is the chat before ``reply``; ``new`` the messages appended after it.
        ``stopped`` says the sampled ids already end with the end token.
        """
        closing = self.closing_text(history)
        if stopped and closing.startswith(self.eos_text):
            closing = closing[len(self.eos_text) :]
        before = render(self.tokenizer, [*history, reply], add_generation_prompt=False)
        after = render(self.tokenizer, [*history, reply, *new], add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template is not prefix-stable: cannot extend prompts")
        return closing + after[len(before) :]

    def pieces(
        self,
        history: Sequence[Message],
        reply: Message | None,
        stopped: bool,
        groups: Sequence[Sequence[Message]],
    ) -> list[str]:
        """External text of several message groups appended at once, one string per group
        (each its own segment; only the last ends with the generation prompt).

        After a sampled ``reply`` the first piece starts as ``suffix`` does; without one,
        ``history`` was rendered without a generation prompt (the prompt of a conversation a
        simulated user opens) and the first piece starts right after it. Every cut falls after
        a message's closing text, i.e. next to a special token, so the pieces tokenise alone
        exactly as inside the full render.
        """
        base = [*history, reply] if reply is not None else list(history)
        before = render(self.tokenizer, base, add_generation_prompt=False)
        lead = ""
        if reply is not None:
            lead = self.closing_text(history)
            if stopped and lead.startswith(self.eos_text):
                lead = lead[len(self.eos_text) :]
        out, messages = [], list(base)
        for i, group in enumerate(groups):
            messages += group
            after = render(self.tokenizer, messages, add_generation_prompt=i == len(groups) - 1)
            if not after.startswith(before):
                raise ValueError("the chat template is not prefix-stable: cannot extend prompts")
            out.append(lead + after[len(before) :])
            lead, before = "", after
        return out

    def canonical(self, ids: Sequence[int]) -> list[int]:
        """The tokenizer's own ids for the text that ``ids`` decode to."""
        return self.encode(self.decode(ids))

    def drifted(self, segments: Sequence[Segment], messages: Sequence[Message]) -> bool:
        """True when the built prompt differs from a tokenisation of the full re-rendered chat.

        Sampled segments are compared in canonical form, so a non-canonical sample (counted on
        its own, see ``canonical``) is not mistaken for a builder defect.
        """
        built: list[int] = []
        for seg in segments:
            built += self.canonical(seg.token_ids) if seg.role.trained else list(seg.token_ids)
        return built != self.prompt_ids(messages)


def rehearsal_segments(rehearsal: Rehearsal) -> tuple[Segment, ...]:
    """A rehearsal as a two-segment sequence (its prompt, then the sampled completion)."""
    prompt = Segment(role=Role.PROMPT, token_ids=rehearsal.prompt_ids, text="")
    return (prompt, rehearsal.completion)


def role_mask(segments: Sequence[Segment]) -> list[int]:
    """Per token: ``MASK_ACT``/``MASK_REHEARSE`` where trained, ``MASK_NONE`` elsewhere."""
    value = {Role.ACT: MASK_ACT, Role.REHEARSE: MASK_REHEARSE}
    return [value.get(s.role, MASK_NONE) for s in segments for _ in s.token_ids]


def training_rows(
    episode: Episode, rehearse_rewards: Sequence[float | None] | None = None
) -> list[TrainRow]:
    """Step-as-sample rows: one per act segment (agent context before it as prompt), then one
    per rehearsal (its own prompt). Prompt, tool/real and user tokens are never completions.

    Every row carries the episode's reward, except rehearse rows when ``rehearse_rewards``
    gives one per rehearsal (a reward per row: ``training.world_reward``)."""
    if rehearse_rewards is not None and len(rehearse_rewards) != len(episode.rehearsals):
        raise ValueError(
            f"episode {episode.id}: {len(rehearse_rewards)} rehearse rewards for "
            f"{len(episode.rehearsals)} rehearsals"
        )
    rows: list[TrainRow] = []
    prefix: list[int] = []
    for segment in episode.segments:
        if segment.role is Role.ACT:
            rows.append(_row(episode, Role.ACT, prefix, segment, episode.reward))
        prefix.extend(segment.token_ids)
    for i, rehearsal in enumerate(episode.rehearsals):
        reward = episode.reward if rehearse_rewards is None else rehearse_rewards[i]
        rows.append(
            _row(episode, Role.REHEARSE, rehearsal.prompt_ids, rehearsal.completion, reward)
        )
    return rows


def _row(
    episode: Episode, role: Role, prompt: Sequence[int], segment: Segment, reward: float | None
) -> TrainRow:
    if segment.logprobs is None:
        raise ValueError(f"episode {episode.id}: a sampled {role} segment has no logprobs")
    return TrainRow(
        episode_id=episode.id,
        group_id=episode.group_id,
        role=role,
        prompt_ids=tuple(prompt),
        completion_ids=segment.token_ids,
        old_logprobs=segment.logprobs,
        reward=reward,
    )
