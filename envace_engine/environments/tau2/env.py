"""The τ² environment: one episode's private database and the domain's whitelisted tools.

A call is dispatched by **name lookup in the domain's tool table** (never ``getattr``), its
arguments are checked against our schema (missing, unknown or wrongly typed arguments are
refused before any tool code runs: τ² would raise a Python error there), and a refusal by the
tool itself (``Tau2Error``) or any other exception becomes an error result. Either way the
database is unchanged, because every tool checks first and writes last. The state hash is
SHA-256 of the canonical JSON (sorted keys) of the database.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from envace_engine.environments.schema import check_object
from envace_engine.environments.tau2 import airline_tools, mock, retail_tools
from envace_engine.environments.tau2.dataset import fresh_db
from envace_engine.environments.tau2.tools import Db, Tau2Error, Tool
from envace_engine.types import Task, ToolCall, ToolError, ToolResult

TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"
TOOL_EXECUTION_ERROR = "TOOL_EXECUTION_ERROR"

_TABLES: dict[str, tuple[Tool, ...]] = {
    "airline": airline_tools.TOOLS,
    "retail": retail_tools.TOOLS,
    "mock": mock.TOOLS,
}
_ASSERTIONS: dict[str, Mapping[str, Callable[..., bool]]] = {"mock": mock.ASSERTIONS}


@dataclass(frozen=True)
class Domain:
    """A domain's tools by name and its env-assertion functions."""

    name: str
    tools: Mapping[str, Tool]
    assertions: Mapping[str, Callable[..., bool]]

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI schemas of every tool, in table order."""
        return [tool.schema for tool in self.tools.values()]

    def writes(self, name: str) -> bool:
        """Whether ``name`` is a tool that can change the database."""
        tool = self.tools.get(name)
        return tool is not None and tool.writes


@cache
def domain(name: str) -> Domain:
    """The domain called ``name`` (airline, retail, mock)."""
    if name not in _TABLES:
        raise ValueError(f"unknown τ² domain {name!r}; valid domains: {', '.join(_TABLES)}")
    tools = {tool.name: tool for tool in _TABLES[name]}
    return Domain(name, tools, dict(_ASSERTIONS.get(name, {})))


def state_hash(db: Db) -> str:
    """SHA-256 of the canonical JSON of a database (sorted keys)."""
    text = json.dumps(db, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def error_json(error: ToolError) -> dict[str, Any]:
    """A refused call as the JSON the agent sees (what a reference result records)."""
    return {"error": {"code": error.code, "message": error.message}}


class Tau2Environment:
    """One episode of a τ² domain (implements ``Environment``)."""

    def __init__(self, task: Task, dom: Domain, db: Db) -> None:
        self.task = task
        self.domain = dom
        self.db = db
        self.errors = 0  # error results so far (τ² ends a run at 10)

    def tools(self) -> list[dict[str, Any]]:
        """The domain's tool schemas (the same in every turn)."""
        return self.domain.schemas

    def start_turn(self, turn: int) -> None:
        """τ² tools never change between turns."""

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one call; a refused call is an error result and changes nothing."""
        result = self._run(call)
        self.errors += not result.ok
        return result

    def _run(self, call: ToolCall) -> ToolResult:
        tool = self.domain.tools.get(call.name) if isinstance(call.name, str) else None
        if tool is None:
            names = ", ".join(self.domain.tools)
            message = f"Tool '{call.name}' not found; available tools: {names}"
            return ToolResult(error=ToolError(TOOL_NOT_AVAILABLE, message, call.raw))
        problem = check_object(call.arguments, tool.parameters, f"{call.name} arguments")
        if problem:
            return ToolResult(error=ToolError(INVALID_PARAMETERS, problem, call.raw))
        try:
            value = tool.fn(self.db, **copy.deepcopy(call.arguments))
        except Tau2Error as err:
            return ToolResult(error=ToolError(TOOL_EXECUTION_ERROR, str(err), call.raw))
        except Exception as err:  # any failure of tool code is the agent's error result
            message = f"{type(err).__name__}: {err}"
            return ToolResult(error=ToolError(TOOL_EXECUTION_ERROR, message, call.raw))
        # A copy: a result the episode keeps must not change when the database does later.
        return ToolResult(value=copy.deepcopy(value))

    def state(self) -> dict[str, Any]:
        """The live database (large: airline is 7 MB of JSON). Do not mutate it."""
        return self.db

    def state_hash(self) -> str:
        """The canonical hash of the database now."""
        return state_hash(self.db)

    def check(self, func_name: str, arguments: Mapping[str, Any]) -> bool:
        """Run an env-assertion function; an unknown one or a failure counts as false."""
        fn = self.domain.assertions.get(func_name)
        if fn is None:
            return False
        try:
            return bool(fn(self.db, **dict(arguments)))
        except Exception:  # a malformed assertion is a failed one
            return False


def _merge(base: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def apply_initial_state(env: Tau2Environment, initial: Mapping[str, Any]) -> None:
    """A task's pre-conversation state (mock only): the agent-DB patch (deep merge), then the
    initialisation calls, then the tool calls of the earlier messages (replayed)."""
    data = initial.get("initialization_data") or {}
    _merge(env.db, data.get("agent_data") or {})
    for action in initial.get("initialization_actions") or []:
        env.execute(ToolCall(action["func_name"], dict(action.get("arguments") or {})))
    for call in initial.get("history_calls") or []:
        env.execute(ToolCall(call["name"], dict(call.get("arguments") or {})))
    env.errors = 0


def make_env(task: Task) -> Tau2Environment:
    """A fresh environment for a τ² task: a private database at the task's initial state."""
    name = str(task.meta.get("domain", ""))
    env = Tau2Environment(task, domain(name), fresh_db(name))
    if task.initial_state:
        apply_initial_state(env, task.initial_state)
    return env
