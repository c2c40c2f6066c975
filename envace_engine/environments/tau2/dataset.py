"""τ²-bench data files (``data/``): the task schema (pydantic: it parses outside JSON), and loaders.

The files live in ``tau2/data/`` beside this module (MIT, Sierra Research; ``data/SOURCE.md``
and ``data/LICENSE`` go with every copy). Each domain folder holds ``db.json``, ``policy.md``,
``split_tasks.json`` and ``tasks.json``; ``user_simulator/`` the user guidelines.

The database is parsed **once per process** and kept as a pickle blob; ``fresh_db`` unpickles it,
which is a deep copy of plain JSON data about five times faster than ``copy.deepcopy`` (airline:
0.02 s against 0.1 s), so every episode and every replay gets its own database cheaply.
"""

from __future__ import annotations

import json
import pickle
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DOMAINS = ("airline", "retail", "mock")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Instructions(_Model):
    """The structured user instructions of an airline or retail task."""

    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str | None = None


class UserScenario(_Model):
    """Who the simulated user is and what they want (mock tasks use a plain string)."""

    persona: str | None = None
    instructions: Instructions | str


class Action(_Model):
    """One reference action: a tool call of the gold trajectory."""

    action_id: str = ""
    requestor: str = "assistant"
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    info: str | None = None
    compare_args: list[str] | None = None


class EnvAssertion(_Model):
    """A boolean function run on the final environment, compared with ``assert_value``."""

    env_type: str = "assistant"
    func_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    assert_value: bool = True
    message: str | None = None


class InitAction(_Model):
    """An environment function call run before the conversation (mock only)."""

    env_type: str = "assistant"
    func_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class InitialState(_Model):
    """Pre-conversation state: a DB patch, function calls and earlier messages (mock only)."""

    initialization_data: dict[str, Any] | None = None
    initialization_actions: list[InitAction] | None = None
    message_history: list[dict[str, Any]] | None = None


class Criteria(_Model):
    """How a task is scored (docs/tasks.md, "τ²-bench"); ``reward_basis`` None means
    τ²'s default ``[DB, COMMUNICATE]``."""

    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[str] | None = None


class TaskSpec(BaseModel):
    """One entry of ``tasks.json``. Informational fields are kept loosely typed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    description: dict[str, Any] | None = None
    user_scenario: UserScenario
    ticket: str | None = None
    initial_state: InitialState | None = None
    evaluation_criteria: Criteria | None = None
    issues: list[dict[str, Any]] | None = None
    annotations: Any = None
    required_documents: Any = None
    user_tools: Any = None


def _text(*parts: str) -> str:
    return (
        resources.files("envace_engine.environments.tau2")
        .joinpath("data", *parts)
        .read_text(encoding="utf-8")
    )


def _check(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}; valid domains: {', '.join(DOMAINS)}")


@cache
def task_specs(domain: str) -> tuple[TaskSpec, ...]:
    """Every task of a domain, validated, in file order."""
    _check(domain)
    return tuple(TaskSpec.model_validate(t) for t in json.loads(_text(domain, "tasks.json")))


@cache
def splits(domain: str) -> dict[str, tuple[str, ...]]:
    """``split_tasks.json``: split name -> task ids."""
    _check(domain)
    raw = json.loads(_text(domain, "split_tasks.json"))
    return {str(name): tuple(str(i) for i in ids) for name, ids in raw.items()}


@cache
def policy(domain: str) -> str:
    """The domain policy the agent gets in its context."""
    _check(domain)
    return _text(domain, "policy.md").strip()


@cache
def user_guidelines(with_tools: bool = False) -> str:
    """The user simulator's global guidelines (the tools variant for users with tools)."""
    name = "simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md"
    return _text("user_simulator", name).strip()


@cache
def _db_blob(domain: str) -> bytes:
    _check(domain)
    # Our own pickle of parsed JSON (never outside bytes): plain dicts, lists, strings, numbers.
    return pickle.dumps(json.loads(_text(domain, "db.json")), protocol=pickle.HIGHEST_PROTOCOL)


def fresh_db(domain: str) -> dict[str, Any]:
    """A private deep copy of the domain's database (parsed once per process)."""
    db: dict[str, Any] = pickle.loads(_db_blob(domain))
    return db
