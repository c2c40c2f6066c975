"""``ToolEnvironment``: an ``Environment`` over live backend objects, dispatching by whitelist.

Every suite (BFCL, bfcl-gen, toy) builds one of these per episode: a dict of freshly loaded
backend instances plus the OpenAI tool schemas the agent may call. The whitelist *is* the tool
schemas: a call's name is looked up in a dict built from trusted schema names, never passed to
``getattr`` as given, so a model cannot reach private methods, dunders or anything undocumented.
Arguments are validated against the schema before any tool code runs; exceptions raised by tool
code become ``TOOL_EXECUTION_ERROR`` results. Error dicts a backend returns itself (BFCL's
``{"error": ...}``) are ordinary values, exactly as BFCL treats them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from envace_engine.environments.schema import check_object, tool_name
from envace_engine.types import Task, ToolCall, ToolError, ToolResult

TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"
TOOL_EXECUTION_ERROR = "TOOL_EXECUTION_ERROR"


@dataclass(frozen=True)
class RawOutcome:
    """A call's outcome before JSON conversion: the backend's own return value, or an error."""

    value: Any = None
    error: ToolError | None = None


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a backend value or state (objects become their public attributes).

    ``parent`` links (BFCL's file system directories) are skipped: they make cycles.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [jsonable(v) for v in items]
    if hasattr(value, "__dict__"):
        return {
            k: jsonable(v)
            for k, v in vars(value).items()
            if not k.startswith("_") and k != "parent"
        }
    return str(value)


def public_state(instance: Any) -> dict[str, Any]:
    """The public attributes of a backend instance as JSON (what BFCL's state check compares)."""
    return {k: jsonable(v) for k, v in vars(instance).items() if not k.startswith("_")}


def parameter_schemas(tools: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters' JSON schema (the first schema of a repeated name wins)."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools:
        schemas.setdefault(tool_name(tool), tool["function"].get("parameters", {}))
    return schemas


def check_call(call: ToolCall, schemas: Mapping[str, dict[str, Any]]) -> ToolError | None:
    """The error a tool layer returns before running anything, or None when ``call`` passes.

    ``schemas`` maps each offered tool's name to its parameters' schema
    (``parameter_schemas``). The check needs nothing but the call and the schemas, so a rollout
    can apply it to a call no environment will run (``RolloutConfig.check_calls``) and give
    exactly the error the real tools would.
    """
    schema = schemas.get(call.name) if isinstance(call.name, str) else None
    if schema is None:
        names = ", ".join(sorted(schemas))
        return ToolError(
            TOOL_NOT_AVAILABLE,
            f"no tool named {call.name!r} is available; available tools: {names}",
            call.raw,
        )
    problem = check_object(call.arguments, schema, f"{call.name} arguments")
    return None if problem is None else ToolError(INVALID_PARAMETERS, problem, call.raw)


class ToolEnvironment:
    """One episode's live backends and the tools that reach them (implements ``Environment``).

    ``owners`` maps each tool name to the key of the instance that implements it.
    ``turn_tools`` holds tools that become available from a later user turn on (BFCL's
    ``miss_func`` category): call ``start_turn(t)`` before the agent acts on turn ``t``.
    ``snapshot`` overrides how ``state()`` renders the instances.
    """

    def __init__(
        self,
        task: Task,
        instances: dict[str, Any],
        tools: list[dict[str, Any]],
        owners: Mapping[str, str],
        turn_tools: Mapping[int, list[dict[str, Any]]] | None = None,
        snapshot: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.task = task
        self.instances = instances
        self._owners = dict(owners)
        self._turn_tools = {int(k): list(v) for k, v in (turn_tools or {}).items()}
        self._snapshot = snapshot
        self._tools: list[dict[str, Any]] = []
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            self._add_tool(tool)
        for tool in [t for ts in self._turn_tools.values() for t in ts] + list(tools):
            name = tool_name(tool)
            if name not in self._owners:
                raise ValueError(f"tool {name!r} has no owning backend instance")
            if name.startswith("_"):
                raise ValueError(f"tool {name!r}: private methods can never be tools")

    def _add_tool(self, tool: dict[str, Any]) -> None:
        name = tool_name(tool)
        if name not in self._schemas:
            self._tools.append(tool)
            self._schemas[name] = tool["function"].get("parameters", {})

    def tools(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas available now."""
        return list(self._tools)

    def start_turn(self, turn: int) -> None:
        """Make tools that arrive at or before user turn ``turn`` available (idempotent)."""
        for start, tools in sorted(self._turn_tools.items()):
            if start <= turn:
                for tool in tools:
                    self._add_tool(tool)

    def invoke(self, call: ToolCall) -> RawOutcome:
        """Validate and run one call; the backend's raw return value or a ``ToolError``."""
        refused = check_call(call, self._schemas)
        if refused is not None:
            return RawOutcome(error=refused)
        # The name comes from our own schema table (checked above), never from model text.
        method = getattr(self.instances[self._owners[call.name]], call.name)
        try:
            # A deep copy so that no list or dict the caller still holds becomes backend state.
            value = method(**copy.deepcopy(call.arguments))
        except Exception as err:  # tool code is third-party: any failure becomes a tool error
            return RawOutcome(
                error=ToolError(TOOL_EXECUTION_ERROR, f"{type(err).__name__}: {err}", call.raw)
            )
        return RawOutcome(value=value)

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one parsed call for real; never raises for bad model input."""
        outcome = self.invoke(call)
        if outcome.error is not None:
            return ToolResult(error=outcome.error)
        return ToolResult(value=jsonable(outcome.value))

    def state(self) -> dict[str, Any]:
        """A JSON snapshot of every backend instance's public state."""
        if self._snapshot is not None:
            return self._snapshot(self.instances)
        return {key: public_state(inst) for key, inst in self.instances.items()}
