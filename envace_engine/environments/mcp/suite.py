"""Suite ``mcp:PATH``: tasks against a real MCP server, one fresh session per episode.

``get_suite("mcp:path/to/suite.toml")`` reads the suite file and its task file, starts the
server once to list its tools (``tools/list``, converted to OpenAI function schemas) and checks
every task's reference and state calls against them, so a bad command or a misspelt tool fails
at load, naming the command or the file and line. ``make_env`` opens a session for each
episode (a stdio server: a fresh process), and calls the suite's reset tool first when it names
one (a URL server's way back to its initial state); the rollout closes it when the episode ends
(``McpEnvironment.close``).

Score (``score``): the agent's calls are replayed on a fresh server, then the task's ``state``
probe calls run; the score is the fraction of checks passed, each expected answer text (found
as a whole word in that turn's final answer, as in ``toy``) and each probe (its result equals
the expected one) counting one. A replay that breaks the server scores 0. Formats and the
example server: docs/mcp.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mcp_types
from mcp.shared.exceptions import MCPError

from envace_engine.environments.base import EnvironmentFault, close_env
from envace_engine.environments.mcp.client import McpConnection, ServerSpec
from envace_engine.environments.mcp.spec import (
    McpTaskModel,
    SuiteFileError,
    read_suite_file,
    read_task_file,
    server_spec,
)
from envace_engine.environments.schema import openai_tool
from envace_engine.environments.tool_environment import (
    TOOL_EXECUTION_ERROR,
    check_call,
    parameter_schemas,
)
from envace_engine.environments.toy.suite import answer_credit
from envace_engine.tasks import MAX_REPORTED, TaskFileError
from envace_engine.types import StopReason, Task, ToolCall, ToolError, ToolResult

PREFIX = "mcp:"
MCP_ERROR = "MCP_ERROR"  # the server answered a call with a JSON-RPC error


def to_openai_tool(tool: mcp_types.Tool) -> dict[str, Any]:
    """An MCP tool as the OpenAI function schema the agent's prompt lists."""
    schema = {k: v for k, v in tool.input_schema.items() if k != "title"}
    # pydantic-made schemas title every property ("Item"): tokens that tell a model nothing.
    props = schema.get("properties")
    if isinstance(props, dict):
        schema["properties"] = {
            name: {k: v for k, v in p.items() if k != "title"} if isinstance(p, dict) else p
            for name, p in props.items()
        }
    schema.setdefault("type", "object")
    return openai_tool(tool.name, tool.description or "", schema)


def to_tool_result(result: mcp_types.CallToolResult, call: ToolCall) -> ToolResult:
    """What the agent reads: the text content (parsed as JSON when it is JSON), or, for an
    ``isError`` result, a tool error with that text."""
    texts = [b.text for b in result.content if isinstance(b, mcp_types.TextContent)]
    others = [b.type for b in result.content if not isinstance(b, mcp_types.TextContent)]
    text = "\n".join(texts + [f"[{kind} content]" for kind in others])
    if result.is_error:
        return ToolResult(error=ToolError(TOOL_EXECUTION_ERROR, text or "tool error", call.raw))
    if not result.content and result.structured_content is not None:
        return ToolResult(value=result.structured_content)
    try:
        return ToolResult(value=json.loads(text))
    except ValueError:
        return ToolResult(value=text)


class McpEnvironment:
    """One episode's server (implements ``Environment``, plus ``close``)."""

    def __init__(self, task: Task, spec: ServerSpec) -> None:
        self.task = task
        self._conn = McpConnection(spec)
        listed = [t for t in self._conn.tools if t.name != spec.reset_tool]
        self._tools = [to_openai_tool(t) for t in listed]
        self._schemas = parameter_schemas(self._tools)
        self._calls = 0
        # a reset that fails ends the episode at its first call (never the job): the loop
        # handles an EnvironmentFault from ``execute``, not from opening the environment
        self._fault = self._reset()

    def _reset(self) -> EnvironmentFault | None:
        """Call the suite's reset tool, if it names one; the fault it caused, if any."""
        spec = self._conn.spec
        if spec.reset_tool is None:
            return None
        try:
            result = self._conn.call(spec.reset_tool, dict(spec.reset_arguments))
        except EnvironmentFault as fault:
            return fault
        except MCPError as err:
            refused = err.error.message
            return EnvironmentFault(StopReason.ENV_MALFORMED, f"reset tool refused: {refused}")
        failed = to_tool_result(result, ToolCall(spec.reset_tool, {})).error
        if failed is not None:
            what = f"reset tool {spec.reset_tool!r} failed: {failed.message}"
            return EnvironmentFault(StopReason.ENV_MALFORMED, what)
        return None

    def tools(self) -> list[dict[str, Any]]:
        """The server's tools, as listed when this episode's server started."""
        return list(self._tools)

    def start_turn(self, turn: int) -> None:
        """MCP tools do not change between user turns here."""

    def execute(self, call: ToolCall) -> ToolResult:
        """Check the call against the schemas (the same errors as every suite, and nothing
        malformed reaches the server), then ``tools/call``. A broken server raises
        ``EnvironmentFault``; everything the server says is a result."""
        if self._fault is not None:
            raise self._fault
        refused = check_call(call, self._schemas)
        if refused is not None:
            return ToolResult(error=refused)
        self._calls += 1
        try:
            result = self._conn.call(call.name, call.arguments)
        except MCPError as err:
            return ToolResult(error=ToolError(MCP_ERROR, err.error.message, call.raw))
        return to_tool_result(result, call)

    def state(self) -> dict[str, Any]:
        """What is known from outside: the server and how many calls it ran (an MCP server's
        state is its own; the task's ``state`` probes read it through tools)."""
        return {"server": self._conn.spec.describe(), "calls": self._calls}

    def close(self) -> None:
        """Stop this episode's server (idempotent)."""
        self._conn.close()


class McpSuite:
    """The tasks of one suite file against its server (implements ``Suite``)."""

    # each episode's session starts a server process (or a handshake): a batch's are opened
    # side by side (``rollout.loop.open_envs``)
    slow_start = True

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        model = read_suite_file(path)
        self.system = model.system
        self.spec = server_spec(model.server, path.parent)
        task_path = (path.parent / model.tasks).resolve()
        lines = read_task_file(task_path)  # format errors first: no server needed for them
        probe = McpConnection(self.spec)
        try:
            listed = {t.name: t for t in probe.tools}
        finally:
            probe.close()
        reset = self.spec.reset_tool
        if reset is not None and reset not in listed:
            raise SuiteFileError(
                f"{path}: field 'server.reset_tool': the server lists no tool {reset!r}; its "
                f"tools: {', '.join(sorted(listed))}"
            )
        self.tool_schemas = tuple(to_openai_tool(t) for n, t in listed.items() if n != reset)
        self._check_calls(task_path, lines)
        self._tasks = [self._task(model) for _, model in lines]

    def _check_calls(self, path: Path, lines: list[tuple[int, McpTaskModel]]) -> None:
        """Every reference and probe call must pass the server's tool schemas."""
        schemas = parameter_schemas(self.tool_schemas)
        errors = []
        for number, task in lines:
            calls = [("reference_calls", c) for turn in task.reference_calls for c in turn]
            for field, c in calls + [("state", p) for p in task.state]:
                refused = check_call(ToolCall(c.name, c.arguments), schemas)
                if refused is not None:
                    errors.append(f"{path}:{number}: field '{field}': {refused.message}")
        if errors:
            raise TaskFileError(str(path), errors[:MAX_REPORTED], len(errors))

    def _task(self, model: McpTaskModel) -> Task:
        refs = model.reference_calls
        return Task(
            id=model.id,
            suite=self.name,
            user_turns=tuple(model.user_turns),
            tools=self.tool_schemas,
            initial_state={},
            reference_calls=tuple(tuple(ToolCall(c.name, c.arguments) for c in t) for t in refs),
            reference_results=tuple(tuple(c.result for c in turn) for turn in refs),
            system=self.system if model.system is None else model.system,
            meta={
                "split": model.split,
                "answers": list(model.answers),
                "state": [p.model_dump() for p in model.state],
            },
        )

    def tasks(self, split: str = "train") -> list[Task]:
        """The task file's tasks of ``split``, in file order."""
        splits = sorted({t.meta["split"] for t in self._tasks})
        if split not in splits:
            raise ValueError(f"suite {self.name!r} has no split {split!r}; splits: {splits}")
        return [t for t in self._tasks if t.meta["split"] == split]

    def make_env(self, task: Task) -> McpEnvironment:
        """A fresh server process for one episode."""
        return McpEnvironment(task, self.spec)

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """The fraction of the task's checks passed (module docstring)."""
        expected = list(task.meta.get("answers") or [])
        said = answer_credit(expected, answers)
        hits = (said or 0.0) * sum(bool(e) for e in expected)
        probes = task.meta.get("state") or []
        if probes:
            hits += self._probe_hits(task, calls_per_turn, probes)
        total = sum(bool(e) for e in expected) + len(probes)
        return hits / total if total else 0.0

    def _probe_hits(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], probes: list[dict]
    ) -> int:
        """Replay the agent's calls on a fresh server, then count the probes that match."""
        env = self.make_env(task)
        try:
            for turn, calls in enumerate(calls_per_turn):
                env.start_turn(turn)
                for call in calls:
                    env.execute(call)
            results = [env.execute(ToolCall(p["name"], p["arguments"])) for p in probes]
        except EnvironmentFault:
            return 0  # the server broke under the agent's calls: nothing is verified
        finally:
            close_env(env)
        return sum(r.ok and r.value == p["result"] for r, p in zip(results, probes, strict=True))


def load_suite(name: str) -> McpSuite:
    """The suite ``mcp:PATH`` (``name`` as given, so ``get_suite(task.suite)`` finds it)."""
    path = name.removeprefix(PREFIX)
    if not path:
        raise ValueError("suite 'mcp:' needs a suite file: mcp:path/to/suite.toml")
    return McpSuite(name, Path(path))
