"""Task-success rewards (docs/method.md §3), pluggable.

* ``state`` — replay the agent's committed calls on a fresh real backend and compare the final
  state and answers with the reference (``Suite.score``). Deterministic; the default. A suite
  that scores whole episodes (``EpisodeScorer``: τ²) gets the episode, and the judge endpoint,
  when one is configured, for its NL assertions.
* ``reference`` — compare the agent's calls with the reference calls; no execution.
* ``judge`` — an LLM judge over an OpenAI-compatible endpoint (SGLang serves one) with a checklist
  rubric; the score is the fraction of checklist items the judge marks as met.

A reward function returns ``None`` when an episode cannot be scored (the judge failed, or its
answer did not parse). ``None`` is carried through to the advantages, which exclude the episode
from its group's baseline: an unscorable episode is never silently scored 0.

These are task rewards. A rehearse row is shaped through the agent's success, and, with
``world.task_weight`` < 1, also by its own fidelity (``training.world_reward``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import httpx

from envace_engine.environments import reference_match
from envace_engine.environments.base import EpisodeScorer, NlJudge, Score, Suite
from envace_engine.rollout.endpoints import Endpoint, chat
from envace_engine.rollout.endpoints import NlJudge as EndpointJudge
from envace_engine.types import Episode, Task, ToolCall

if TYPE_CHECKING:
    from envace_engine.rollout.endpoints import Endpoint

RewardFn = Callable[[Task, Episode], float | None]
REWARD_KINDS = ("state", "reference", "judge")


def committed_calls(episode: Episode, n_turns: int) -> list[list[ToolCall]]:
    """The agent's tool calls grouped by user turn (every call it made, whoever answered it)."""
    per_turn: list[list[ToolCall]] = [[] for _ in range(n_turns)]
    for record in episode.calls:
        if record.turn < n_turns:
            per_turn[record.turn].append(record.call)
    return per_turn


@runtime_checkable
class PartsReward(Protocol):
    """A reward function that can also give the whole ``Score`` (its named parts), so that
    an evaluation stores the parts beside the reward without scoring twice."""

    def __call__(self, task: Task, episode: Episode) -> float | None:
        """The episode's reward (None: unscorable)."""
        ...

    def score(self, task: Task, episode: Episode) -> Score:
        """The episode's whole score: reward, basis and named parts."""
        ...


@dataclass(frozen=True)
class EpisodeReward:
    """The whole-episode score of an ``EpisodeScorer`` suite (τ², VitaBench) as a reward
    (implements ``PartsReward``); ``judge`` is passed to the suite, or None."""

    suite: EpisodeScorer
    judge: NlJudge | None = None

    def score(self, task: Task, episode: Episode) -> Score:
        """The suite's score of the episode."""
        return self.suite.score_episode(task, episode, self.judge)

    def __call__(self, task: Task, episode: Episode) -> float | None:
        return self.score(task, episode).reward


def state_reward(suite: Suite, judge: NlJudge | None = None) -> RewardFn:
    """Replay the committed calls on a fresh real backend and score the final state
    (``EpisodeScorer`` suites: their whole-episode score; None = unscorable)."""
    if isinstance(suite, EpisodeScorer):
        return EpisodeReward(suite, judge)

    def score(task: Task, episode: Episode) -> float | None:
        calls = committed_calls(episode, len(task.user_turns))
        return float(suite.score(task, calls, list(episode.final_answers)))

    return score


def reference_reward() -> RewardFn:
    """Fraction of reference calls the agent matched (order-aware per turn)."""

    def score(task: Task, episode: Episode) -> float | None:
        return float(reference_match(task, committed_calls(episode, len(task.user_turns))))

    return score


@dataclass(frozen=True)
class JudgeConfig:
    """Where and how to ask the judge. ``url`` is the server root (``/v1/chat/completions``)."""

    url: str
    model: str = "judge"
    timeout_s: float = 60.0
    max_retries: int = 2
    # A ceiling, not a length: VitaBench's judge restates every rubric with a justification
    # in JSON (up to ~20 rubrics per task), which 512 tokens would cut mid-list.
    max_tokens: int = 4096


JUDGE_SYSTEM = (
    "You grade a tool-using assistant. For each checklist item answer whether the transcript "
    'satisfies it. Reply with JSON only: {"items": [true|false, ...]} in checklist order.'
)


def checklist(task: Task) -> list[str]:
    """The rubric: one item per reference call and one per user turn's goal."""
    items = [
        f"Turn {t + 1}: the assistant called {call.name} with {json.dumps(call.arguments)}"
        for t, calls in enumerate(task.reference_calls)
        for call in calls
    ]
    items += [f"Turn {t + 1} was answered: {turn!r}" for t, turn in enumerate(task.user_turns)]
    return items


def parse_verdict(text: str, n_items: int) -> float | None:
    """Fraction of items met from the judge's JSON, or None if it does not parse or count."""
    match = re.search(r"\{.*\}", text, flags=re.DOTALL)
    if match is None:
        return None
    try:
        items = json.loads(match.group(0)).get("items")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(items, list) or len(items) != n_items or n_items == 0:
        return None
    if not all(isinstance(item, bool) for item in items):
        return None
    return sum(items) / n_items


def judge_reward(config: JudgeConfig, client: httpx.Client | None = None) -> RewardFn:
    """Ask an OpenAI-compatible judge; ``None`` when it fails or answers off-format."""

    endpoint = judge_endpoint(config)
    http = client or httpx.Client(timeout=config.timeout_s)

    def score(task: Task, episode: Episode) -> float | None:
        items = checklist(task)
        transcript = "".join(seg.text for seg in episode.segments)
        listed = "\n".join(f"{i + 1}. {item}" for i, item in enumerate(items))
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Checklist:\n{listed}\n\nTranscript:\n{transcript}"},
        ]
        content = chat(endpoint, messages, http)
        return None if content is None else parse_verdict(content, len(items))

    return score


def judge_endpoint(config: JudgeConfig) -> Endpoint:
    """The judge's ``rollout.endpoints.Endpoint`` (greedy, as τ² asks its judge)."""

    return Endpoint(
        config.url.rstrip("/"),
        config.model,
        max_tokens=config.max_tokens,
        timeout_s=config.timeout_s,
        max_retries=config.max_retries,
    )


def nl_judge(config: JudgeConfig) -> NlJudge:
    """τ²'s NL-assertion judge on the judge endpoint (``rollout.endpoints.NlJudge``)."""

    return EndpointJudge(judge_endpoint(config))


def make_reward(kind: str, suite: Suite, judge: JudgeConfig | None = None) -> RewardFn:
    """Build a reward function by name (``state`` | ``reference`` | ``judge``)."""
    if kind == "state":
        return state_reward(suite, nl_judge(judge) if judge is not None else None)
    if kind == "reference":
        return reference_reward()
    if kind == "judge":
        if judge is None:
            raise ValueError("reward 'judge' needs a judge endpoint: set judge_url in the config")
        return judge_reward(judge)
    raise ValueError(f"unknown reward {kind!r}: use one of {', '.join(REWARD_KINDS)}")
