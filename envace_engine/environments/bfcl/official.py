"""BFCL's ``official`` basis: calls run the way BFCL's executor runs them (no extra checks).

BFCL's ``execute_multi_turn_func_call`` maps every public method of the involved classes to its
instance and ``eval``s the call string, so it runs a call with wrongly typed, missing or unknown
arguments (the method raises, or not), an excluded function, and a ``miss_func`` tool before its
turn; an exception becomes ``"Error during execution: <str(e)>"``; ``kill``, ``exit``, ``quit``,
``remove``, ``unlink``, ``popen``, ``Popen`` and ``run`` are refused. ``OfficialEnvironment`` does
the same without ``eval``: the name is looked up in a table built from the classes' documented
tools (which are exactly their public methods), and the arguments go in as keyword arguments.

Kept from the strict dispatcher, for safety only: a private or unknown name never runs, and
numbers stay within the bounds that keep tool code cheap (|x| <= 1e18; ``power``'s exponent,
``square_root``'s and ``logarithm``'s precision). No benchmark call comes near them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from envace_engine.environments.bfcl.backends import LIMITS, make_bfcl_env
from envace_engine.environments.schema import MAX_MAGNITUDE
from envace_engine.environments.tool_environment import (
    INVALID_PARAMETERS,
    TOOL_EXECUTION_ERROR,
    TOOL_NOT_AVAILABLE,
    RawOutcome,
    ToolEnvironment,
)
from envace_engine.types import Task, ToolCall, ToolError

# BFCL's executor refuses these names before evaluating (multi_turn_utils.py).
FORBIDDEN = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})


def _too_big(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return not -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE
    if isinstance(value, list | tuple):
        return any(_too_big(v) for v in value)
    if isinstance(value, dict):
        return any(_too_big(v) for v in value.values())
    return False


def bounds_problem(name: str, arguments: Mapping[str, Any]) -> str | None:
    """Why a call's numbers are out of the safety bounds, or None."""
    for key, value in arguments.items():
        if _too_big(value):
            return f"{name} arguments.{key}: numbers must lie within ±{MAX_MAGNITUDE:g}"
        low, high = LIMITS.get(name, {}).get(key, (None, None))
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if low is not None and high is not None and number and not low <= value <= high:
            return f"{name} arguments.{key} must be between {low} and {high}, got {value:g}"
    return None


class OfficialEnvironment(ToolEnvironment):
    """A ``ToolEnvironment`` that dispatches like BFCL's executor (module docstring).

    ``tools()`` and ``start_turn`` still say what the agent is *offered* (the prompt), but any
    public method of an involved class runs, offered or not.
    """

    def __init__(
        self,
        task: Task,
        instances: dict[str, Any],
        tools: list[dict[str, Any]],
        owners: Mapping[str, str],
        turn_tools: Mapping[int, list[dict[str, Any]]] | None = None,
    ) -> None:
        super().__init__(task, instances, tools, owners, turn_tools)
        self._callable = dict(owners)

    def invoke(self, call: ToolCall) -> RawOutcome:
        """Run one call as BFCL would; the safety bounds are the only check added."""
        name = call.name if isinstance(call.name, str) else ""
        if name in FORBIDDEN:
            message = f"Function call {name} is not allowed."
            return RawOutcome(error=ToolError(TOOL_EXECUTION_ERROR, message, call.raw))
        owner = self._callable.get(name)
        if owner is None:  # what eval would say of a name no involved class defines
            message = f"name {call.name!r} is not defined"
            return RawOutcome(error=ToolError(TOOL_NOT_AVAILABLE, message, call.raw))
        if not isinstance(call.arguments, dict):
            message = f"{name} arguments must be a JSON object"
            return RawOutcome(error=ToolError(INVALID_PARAMETERS, message, call.raw))
        problem = bounds_problem(name, call.arguments)
        if problem:
            return RawOutcome(error=ToolError(INVALID_PARAMETERS, problem, call.raw))
        # The name comes from our table of documented methods, never from model text as such.
        method = getattr(self.instances[owner], name)
        try:
            value = method(**copy.deepcopy(call.arguments))
        except Exception as err:  # BFCL: "Error during execution: {str(e)}"
            return RawOutcome(error=ToolError(TOOL_EXECUTION_ERROR, str(err), call.raw))
        return RawOutcome(value=value)


def make_official_env(task: Task) -> OfficialEnvironment:
    """A fresh BFCL environment for a task under the official basis."""
    env = make_bfcl_env(task, OfficialEnvironment)
    assert isinstance(env, OfficialEnvironment)
    return env
