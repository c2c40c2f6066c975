"""The VitaBench environment: one episode's private database and its domain's tools.

A call is dispatched by **name lookup in the domain's tool table** (never ``getattr``); its
arguments are checked against the tool's schema before any tool code runs (a missing, unknown
or wrongly typed argument is an ``INVALID_PARAMETERS`` error; upstream would raise a Python
error there, also an error). A ``null`` for a parameter whose default is ``null`` counts as
leaving it out. Then, as upstream (spec §4):

* a failed precondition (upstream's ``assert``) answers with its message as an **ordinary**
  result, and so do the tools' own ``Error: …`` texts for unknown ids;
* anything upstream *raises* (an unknown product in an order, an address or a city that matches
  nothing, an unknown booking id in a search) is an **error** result, and only those count
  towards the **10-error ending** (``MAX_ERRORS``; the rollout's ``max_tool_errors``).

The conversation opens with the agent's fixed greeting in the task's language (``greeting``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from envace_engine.environments.schema import check_object
from envace_engine.environments.vita.dataset import check
from envace_engine.environments.vita.prompts import GREETINGS
from envace_engine.environments.vita.tools import TABLES, Tool
from envace_engine.environments.vita.world import Refusal, ToolFailure, World
from envace_engine.types import Task, ToolCall, ToolError, ToolResult

TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"
TOOL_EXECUTION_ERROR = "TOOL_EXECUTION_ERROR"
MAX_ERRORS = 10  # error results that end an episode (upstream's max_errors; reward 0)
# Task.meta keys this environment reads (task.build_task writes them).
DOMAIN_KEY = "vita_domain"
LANGUAGE_KEY = "language"


@dataclass(frozen=True)
class Domain:
    """A domain's tools by name, in one language (the schemas' texts depend on it)."""

    name: str
    language: str
    tools: Mapping[str, Tool]

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The OpenAI schemas of every tool, in table order."""
        return [tool.schema(self.language) for tool in self.tools.values()]

    def writes(self, name: str) -> bool:
        """Whether ``name`` is a tool that can change the database."""
        tool = self.tools.get(name)
        return tool is not None and tool.writes


@cache
def domain(name: str, language: str) -> Domain:
    """The domain called ``name`` (delivery, instore) in ``language`` (zh, en)."""
    check(name, language)
    return Domain(name, language, {tool.name: tool for tool in TABLES[name]})


def _arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    nullable = {p.name for p in tool.params if not p.required and p.default is None}
    return {k: v for k, v in arguments.items() if not (v is None and k in nullable)}


class VitaEnvironment:
    """One episode of a VitaBench domain (implements ``Environment``)."""

    def __init__(self, task: Task, dom: Domain, world: World) -> None:
        self.task = task
        self.domain = dom
        self.world = world
        self.errors = 0  # error results so far (the episode ends at MAX_ERRORS)

    @property
    def greeting(self) -> str:
        """The agent's fixed first message, which the user answers."""
        return GREETINGS[self.domain.language]

    @property
    def too_many_errors(self) -> bool:
        """Whether the episode has reached the error limit (it ends there, reward 0)."""
        return self.errors >= MAX_ERRORS

    def tools(self) -> list[dict[str, Any]]:
        """The domain's tool schemas in the task's language (the same in every turn)."""
        return self.domain.schemas

    def start_turn(self, turn: int) -> None:
        """VitaBench tools never change between turns."""

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises for bad model input."""
        result = self._run(call)
        self.errors += not result.ok
        return result

    def _run(self, call: ToolCall) -> ToolResult:
        tool = self.domain.tools.get(call.name) if isinstance(call.name, str) else None
        if tool is None:
            names = ", ".join(self.domain.tools)
            message = f"Tool '{call.name}' not found; available tools: {names}"
            return ToolResult(error=ToolError(TOOL_NOT_AVAILABLE, message, call.raw))
        args = call.arguments
        if isinstance(args, dict):
            args = _arguments(tool, args)
        schema = tool.parameters(self.domain.language)
        problem = check_object(args, schema, f"{call.name} arguments")
        if problem:
            return ToolResult(error=ToolError(INVALID_PARAMETERS, problem, call.raw))
        try:
            value = tool.fn(self.world, **copy.deepcopy(args))
        except Refusal as refusal:  # upstream's assert: an ordinary answer
            return ToolResult(value=str(refusal))
        except ToolFailure as err:
            return ToolResult(error=ToolError(TOOL_EXECUTION_ERROR, str(err), call.raw))
        except Exception as err:  # any other failure of tool code is an error result too
            message = f"{type(err).__name__}: {err}"
            return ToolResult(error=ToolError(TOOL_EXECUTION_ERROR, message, call.raw))
        return ToolResult(value=value)

    def state(self) -> dict[str, Any]:
        """The live database (plain JSON data). Do not mutate it."""
        return self.world.db


def make_env(task: Task) -> VitaEnvironment:
    """A fresh environment for a task: a private copy of its database (``initial_state``)."""
    name = str(task.meta.get(DOMAIN_KEY, ""))
    language = str(task.meta.get(LANGUAGE_KEY, ""))
    world = World.of(copy.deepcopy(task.initial_state), language)
    return VitaEnvironment(task, domain(name, language), world)
