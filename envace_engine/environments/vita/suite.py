"""Suites ``vita-delivery-zh``, ``vita-delivery-en`` and ``vita-instore``: VitaBench as a ``Suite``.

The language is part of the suite's name (and of every task id and episode), because scores in
the two languages are not interchangeable; in-store ships in English only. Each set is one
100-task ``test`` split (VitaBench has no training split).

**The user.** VitaBench's user is an LLM (``--user``): it gets the task's persona and
instructions (``TaskKey.USER_SYSTEM``) and answers the agent's greeting (``TaskKey.GREETING``).
Without one, the task's one replayed user turn is its instructions verbatim — what upstream's
"dummy" user says in one go — which exercises the tools and the judge but is not a VitaBench
conversation.

**The score** (``score_episode``) is the judge's (``judge.evaluate``): a conversation the user
or the agent ended normally (``GATE_OK``) is judged; any other ending scores 0 unjudged, as
upstream's step limit, error limit and invalid messages do. Without a judge that can chat
(``ChatJudge``) the episode is **unscored** (reward None), never 0. ``order_check`` — the
orders the episode created against the task's ``required_orders`` on (type, store, products and
quantities), cancelled ones left out — is our deterministic diagnostic, reported as its own
component and never as the VitaBench score.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import cache
from typing import Any

from envace_engine.environments.base import ChatJudge, NlJudge, Score
from envace_engine.environments.vita.dataset import LANGUAGES, task_specs
from envace_engine.environments.vita.env import VitaEnvironment, make_env
from envace_engine.environments.vita.judge import Line, evaluate
from envace_engine.environments.vita.task import build_task, suite_name
from envace_engine.types import CallRecord, Episode, MetaKey, StopReason, Task, TaskKey, ToolCall

GATE_OK = frozenset({StopReason.DONE, StopReason.USER_STOP})
SPLITS = ("test",)


@cache
def _tasks(domain: str, language: str) -> tuple[Task, ...]:
    specs = task_specs(domain, language)
    return tuple(build_task(domain, language, spec, spec.instructions) for spec in specs)


def _result_text(record: CallRecord) -> str:
    # The real answer wherever the episode has one (a rehearsal-mode episode's shadow
    # environment): the judge scores what happened, not what the world role imagined.
    got = record.real if record.real is not None else record.seen()
    if got is None:
        return "(no tool response)"
    if got.error is not None:
        return f"Error: {got.error.message}"
    value = got.value
    return value if isinstance(value, str) else repr(value)


def conversation(task: Task, episode: Episode) -> list[Line]:
    """The episode as the judge reads it: the greeting, then per user turn the user's message,
    the agent's calls (one message per reply) with their real results (the seen ones where
    nothing ran for real), and its final answer."""
    users = list(episode.meta.get(MetaKey.USER_MESSAGES) or task.user_turns)
    lines = [Line("assistant", str(task.meta.get(TaskKey.GREETING) or ""))]
    for turn, user in enumerate(users):
        lines.append(Line("user", user))
        by_step: dict[int, list[CallRecord]] = {}
        for record in (r for r in episode.calls if r.turn == turn):
            by_step.setdefault(record.step, []).append(record)
        for records in by_step.values():
            calls = tuple((r.call.name, r.call.arguments) for r in records)
            lines.append(Line("assistant", "", calls))
            lines += [Line("tool", _result_text(r)) for r in records]
        if turn < len(episode.final_answers):
            lines.append(Line("assistant", episode.final_answers[turn]))
    return lines


def _order_key(order: dict[str, Any]) -> tuple[Any, ...]:
    products = sorted(
        (str(p.get("product_id")), int(p.get("quantity") or 0)) for p in order.get("products") or []
    )
    return (order.get("order_type"), order.get("store_id"), tuple(products))


def order_check(task: Task, calls: Sequence[ToolCall]) -> float:
    """1.0 when the live orders the calls create are the task's required ones (see above)."""
    env = make_env(task)
    before = set(env.world.db.get("orders") or {})
    for call in calls:  # reads too: they keep the id counter where the episode had it
        env.execute(call)
    made = [o for k, o in (env.world.db.get("orders") or {}).items() if k not in before]
    wanted = task.meta["evaluation"]["required_orders"]
    live = Counter(_order_key(o) for o in made if o.get("status") != "cancelled")
    required = Counter(
        _order_key(o) for o in wanted if o.get("order_type") and o.get("status") != "cancelled"
    )
    return float(live == required)


class VitaSuite:
    """One VitaBench task set in one language (implements ``Suite`` and ``EpisodeScorer``)."""

    bases = ("official",)

    def __init__(self, domain: str, language: str, basis: str = "official") -> None:
        if language not in LANGUAGES.get(domain, ()):
            raise ValueError(f"VitaBench {domain!r} ships no {language!r} tasks")
        if basis not in self.bases:
            raise ValueError(f"VitaBench scores one way ({self.bases[0]}); got basis {basis!r}")
        self.domain, self.language, self.basis = domain, language, basis
        self.name = suite_name(domain, language)

    def tasks(self, split: str = "test") -> list[Task]:
        """The 100 tasks of the set (``test``: VitaBench has no other split)."""
        if split not in SPLITS:
            raise ValueError(f"{self.name} has no split {split!r}; valid splits: test")
        return list(_tasks(self.domain, self.language))

    def make_env(self, task: Task) -> VitaEnvironment:
        """A fresh environment: a private copy of the task's database."""
        return make_env(task)

    def score_episode(self, task: Task, episode: Episode, judge: NlJudge | None = None) -> Score:
        """The judge's all-rubrics-met reward (None without a chatting judge), with the
        rubric fraction and the order check as components."""
        checked = order_check(task, [r.call for r in episode.calls])
        if episode.stop_reason not in GATE_OK:
            return Score(0.0, self.basis, {"rubric_score": 0.0, "order_check": checked})
        if not isinstance(judge, ChatJudge):
            return Score(None, self.basis, {"rubric_score": None, "order_check": checked})
        evaluation = task.meta["evaluation"]
        facts = (evaluation["instructions"], str(task.meta["time"]), self.language)
        lines = conversation(task, episode)
        verdict = evaluate(lines, evaluation["rubrics"], facts, judge.complete)
        parts = {"rubric_score": verdict.rubric_score, "order_check": checked}
        return Score(verdict.reward, self.basis, {**parts, "judge_unread": float(verdict.unread)})

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """VitaBench has no rule-based score: every reward is the judge's (``score_episode``)."""
        raise ValueError(
            f"{self.name} is scored only by its LLM judge: score whole episodes with "
            "score_episode and a judge endpoint (envace eval --judge)"
        )
