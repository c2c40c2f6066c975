"""``envace world serve``: a checkpoint's world role as an MCP server (docs/mcp.md).

The server lists the tools of a file and answers every ``tools/call`` with the policy's
rehearse role, the way a rollout asks it: the same rehearse prompt (``rehearse_messages``: the
tools, the call, worked examples when the tools come from a suite with reference tasks), the
same chat template and stop token, the same parser (``parse_rehearsal``). An MCP client sends
only a tool name and its arguments, so the prompt's conversation history is empty and the
"latest assistant reply" is the call as the agent would have written it.

Before the model is asked, a call is checked against the tools' schemas (``check_call``): an
unknown tool or refused arguments get exactly the error a real environment gives. Answers are
JSON text; every error (the schema check's, the rehearsed one, an unparseable rehearsal, a
sampler failure) is an ``isError`` result holding ``{"error": {"code", "message"}}``.

The SDK's low-level ``Server`` is used rather than ``MCPServer``: its tools come from Python
signatures, ours from a file's JSON schemas.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envace_engine.environments.mcp.suite import load_suite
from envace_engine.environments.schema import openai_tool, tool_name
from envace_engine.environments.tool_environment import check_call, parameter_schemas
from envace_engine.rollout.parsing import parse_rehearsal, result_to_json
from envace_engine.rollout.prompts import (
    Message,
    RehearseContext,
    assistant_text,
    dumps,
    pick_examples,
    rehearse_messages,
)
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler, SamplingParams
from envace_engine.seeds import derive_seed
from envace_engine.types import Task, ToolCall, ToolError, ToolResult

SERVER_NAME = "envace-world"
MCP_PREFIX = "mcp:"
# Error codes of this server's own refusals (the schema check's codes come from check_call).
UNPARSEABLE_REHEARSAL = "UNPARSEABLE_REHEARSAL"
SAMPLER_ERROR = "SAMPLER_ERROR"
CONTEXT_LIMIT = "CONTEXT_LIMIT"
_TEXT_SHOWN = 2000  # characters of an unparseable rehearsal quoted in its error


class ToolsFileError(ValueError):
    """A tools file that cannot be read or does not hold valid tool schemas."""


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class _Tool(BaseModel):
    """One entry of a tools file: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(default="function", pattern="^function$")
    function: _Function


@dataclass(frozen=True)
class WorldTools:
    """What the server offers: OpenAI tool schemas, and the worked-example pool (a suite's
    reference tasks; a JSON file has none)."""

    tools: tuple[dict[str, Any], ...]
    pool: tuple[Task, ...] = ()
    source: str = ""


def load_tools(source: str) -> WorldTools:
    """``mcp:PATH`` (or a ``.toml`` suite file): the suite server's tools, listed once, and its
    ``train`` tasks as the example pool; anything else: a JSON file of OpenAI tool schemas."""
    if source.startswith(MCP_PREFIX) or source.endswith(".toml"):
        return _suite_tools(source if source.startswith(MCP_PREFIX) else MCP_PREFIX + source)
    return WorldTools(_file_tools(Path(source)), source=source)


def _file_tools(path: Path) -> tuple[dict[str, Any], ...]:
    """A JSON list of OpenAI tool schemas (or ``{"tools": [...]}``), names unique."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ToolsFileError(f"{path}: cannot be read as JSON: {err}") from err
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ToolsFileError(f"{path}: expected a non-empty JSON list of tool schemas")
    tools = []
    for i, entry in enumerate(entries):
        try:
            fn = _Tool.model_validate(entry).function
        except ValidationError as err:
            raise ToolsFileError(f"{path}: tool {i}: {err.errors()[0]['msg']}") from err
        tools.append(openai_tool(fn.name, fn.description, fn.parameters))
    names = [tool_name(t) for t in tools]
    if len(set(names)) != len(names):
        raise ToolsFileError(f"{path}: tool names repeat: {sorted(names)}")
    return tuple(tools)


def _suite_tools(name: str) -> WorldTools:
    # Imported here: the MCP suite is loaded (and its server started once) only when asked for.
    suite = load_suite(name)
    try:
        pool = tuple(suite.tasks("train"))
    except ValueError:  # a suite without a train split: no worked examples
        pool = ()
    return WorldTools(suite.tool_schemas, pool, name)


@dataclass(frozen=True)
class ServeSettings:
    """How the world role samples (greedy by default) and how its prompt is built."""

    max_new_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    n_examples: int = 0
    context_limit: int = 8192


@dataclass(frozen=True)
class Answer:
    """One ``tools/call`` answer: the JSON value shown as text, and whether it is an error."""

    value: Any
    is_error: bool

    @staticmethod
    def of(result: ToolResult) -> Answer:
        return Answer(result_to_json(result), result.error is not None)

    @staticmethod
    def error(code: str, message: str, **extra: Any) -> Answer:
        return Answer({"error": {"code": code, "message": message}, **extra}, True)


class World:
    """The rehearse role over one sampler: a call in, an ``Answer`` out (thread-safe)."""

    def __init__(
        self, sampler: Sampler, tokenizer: Any, tools: WorldTools, settings: ServeSettings
    ) -> None:
        self.sampler = sampler
        self.chat = ChatTokenizer(tokenizer)
        self.tools = tools
        self.settings = settings
        self._schemas = parameter_schemas(tools.tools)
        # A stand-in task: the rehearse prompt reads its tools (and the examples' choice does);
        # it has no references, world state or history, as an MCP client gives none.
        self._task = Task("mcp-client", tools.source, ("",), tools.tools, {})
        self._ctx = RehearseContext(
            tools=tools.tools,
            task=self._task,
            grounded=False,
            examples=pick_examples(self._task, tools.pool, settings.n_examples),
        )
        self._lock = threading.Lock()  # one generation at a time: the sampler is not shared
        self._calls = 0

    def messages(self, call: ToolCall) -> list[Message]:
        """The rehearse prompt for ``call``, as a rollout builds it with an empty history."""
        return rehearse_messages(self._ctx, [], assistant_text([call]), call)

    def answer(self, name: str, arguments: dict[str, Any]) -> Answer:
        """The schema check's error, else the rehearsed result (or why there is none)."""
        call = ToolCall(name, arguments, json.dumps({"name": name, "arguments": arguments}))
        refused = check_call(call, self._schemas)
        if refused is not None:
            return Answer.of(ToolResult(error=refused))
        ids = self.chat.prompt_ids(self.messages(call))
        limit = self.settings.context_limit
        if len(ids) + self.settings.max_new_tokens > limit:
            return Answer.error(
                CONTEXT_LIMIT, f"rehearse prompt of {len(ids)} tokens (cap {limit})"
            )
        return self._rehearse(ids)

    def _rehearse(self, ids: list[int]) -> Answer:
        with self._lock:
            params = self._params()
            gen = self.sampler.generate([ids], params)[0]
        if gen.finish_reason in ("abort", "error"):
            return Answer.error(SAMPLER_ERROR, gen.error or gen.finish_reason)
        text = self.chat.decode(gen.token_ids)
        parsed = parse_rehearsal(text)
        if parsed.result is None:
            error = parsed.error or ToolError(UNPARSEABLE_REHEARSAL, "")
            why = f"the world model's answer could not be parsed ({error.code}: {error.message})"
            return Answer.error(UNPARSEABLE_REHEARSAL, why, text=text[:_TEXT_SHOWN])
        return Answer.of(parsed.result)

    def _params(self) -> SamplingParams:
        """This call's sampling params; a seeded run gives every call its own stream."""
        s = self.settings
        seed = None if s.seed is None else derive_seed(s.seed, "world-serve", self._calls)
        self._calls += 1
        return SamplingParams(
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            stop_token_ids=(self.chat.eos_id,),
            seed=seed,
        )


def mcp_tool(tool: dict[str, Any]) -> mcp_types.Tool:
    """An OpenAI tool schema as the MCP tool ``tools/list`` shows."""
    fn = tool["function"]
    return mcp_types.Tool(
        name=fn["name"], description=fn.get("description") or None, input_schema=fn["parameters"]
    )


def call_result(answer: Answer) -> mcp_types.CallToolResult:
    """An ``Answer`` as the ``tools/call`` result: its JSON as text, ``isError`` for errors."""
    text = mcp_types.TextContent(type="text", text=dumps(answer.value))
    return mcp_types.CallToolResult(content=[text], is_error=answer.is_error)


def build_server(world: World) -> Server[Any]:
    """The SDK server: ``tools/list`` from the file, ``tools/call`` from the world role."""
    listed = [mcp_tool(t) for t in world.tools.tools]

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> Any:
        # Sampling is CPU/GPU work: off the event loop, so pings and other requests still flow.
        arguments = dict(params.arguments or {})
        answer = await anyio.to_thread.run_sync(world.answer, params.name, arguments)
        return call_result(answer)

    return Server(SERVER_NAME, on_list_tools=list_tools, on_call_tool=call_tool)


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_stdio(server: Server[Any]) -> None:
    """Serve one client over stdin/stdout until it disconnects."""
    anyio.run(_serve_stdio, server)


def serve_http(server: Server[Any], port: int, host: str = "127.0.0.1") -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted."""

    app = server.streamable_http_app(host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
