"""``envace world serve``: the world role as an MCP server (docs/mcp.md).

One real server (``tiny``, random weights: its answers are garbage) is spawned over stdio and
driven by the SDK's client: the protocol is asserted, never the content. The mapping of
rehearsals to results (a value, a rehearsed error, an unparseable answer) is checked with a
scripted sampler whose text is known.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import mcp_types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from envace_engine.cli.world_serve import (
    UNPARSEABLE_REHEARSAL,
    ServeSettings,
    ToolsFileError,
    World,
    WorldTools,
    call_result,
    load_tools,
)
from envace_engine.rollout.prompts import RehearseContext, assistant_text, rehearse_messages
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.types import Task, ToolCall

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_stock",
            "description": "The units in stock of one item.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "remove_stock",
            "description": "Ship units of an item.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "units": {"type": "integer"}},
                "required": ["item", "units"],
            },
        },
    },
]
_ENV_KEYS = ("ENVACE_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture()
def tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS), encoding="utf-8")
    return path


def _server(tools: Path) -> StdioServerParameters:
    args = ["-m", "envace_engine.cli", "world", "serve", "--model", "tiny"]
    args += ["--tools", str(tools), "--stdio", "--max-new-tokens", "16"]
    # The SDK passes only HOME, PATH and the like on: the model cache and offline flags too.
    env = {k: os.environ[k] for k in _ENV_KEYS if k in os.environ}
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))


def _is_json_answer(result: mcp_types.CallToolResult) -> bool:
    """A well-formed answer: one JSON text block; an error holds a code and a message."""
    assert len(result.content) == 1 and isinstance(result.content[0], mcp_types.TextContent)
    value = json.loads(result.content[0].text)
    if result.is_error:
        assert set(value["error"]) == {"code", "message"}
    return True


async def _session(tools: Path) -> None:
    with anyio.fail_after(200):
        async with Client(stdio_client(_server(tools)), cache=None) as client:
            listed = (await client.list_tools()).tools
            assert [t.name for t in listed] == ["get_stock", "remove_stock"]
            for tool, want in zip(listed, TOOLS, strict=True):
                assert tool.description == want["function"]["description"]
                assert tool.input_schema == want["function"]["parameters"]
            answer = await client.call_tool("get_stock", {"item": "figs"})
            assert _is_json_answer(answer)
            unknown = await client.call_tool("sell_stock", {"item": "figs"})
            assert unknown.is_error and _is_json_answer(unknown)
            assert '"TOOL_NOT_AVAILABLE"' in unknown.content[0].text  # type: ignore[union-attr]
            refused = await client.call_tool("remove_stock", {"item": "figs"})
            assert refused.is_error
            assert '"INVALID_PARAMETERS"' in refused.content[0].text  # type: ignore[union-attr]


def test_an_sdk_client_lists_and_calls_the_served_world(tools_file):
    anyio.run(_session, tools_file)


# -- the world role without a process: a scripted sampler --------------------------------------


class TextSampler:
    """Answers every prompt with ``text`` (tokenised), and keeps the prompts it saw."""

    def __init__(self, tokenizer, text: str) -> None:
        self.tokenizer, self.text, self.prompts = tokenizer, text, []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.prompts += prompts
        ids = tuple(self.tokenizer(self.text, add_special_tokens=False)["input_ids"])
        return [Generation(ids, tuple(0.0 for _ in ids), "stop") for _ in prompts]


def _world(tokenizer, text: str) -> tuple[World, TextSampler]:
    sampler = TextSampler(tokenizer, text)
    tools = WorldTools(tuple(TOOLS), source="tools.json")
    return World(sampler, tokenizer, tools, ServeSettings(max_new_tokens=32)), sampler


def _payload(result: mcp_types.CallToolResult) -> object:
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return json.loads(block.text)


@pytest.mark.timeout(60)
def test_a_rehearsed_value_is_the_json_text_of_the_result(tokenizer):
    world, sampler = _world(tokenizer, '<execution_result>{"units": 12}</execution_result>')
    result = call_result(world.answer("get_stock", {"item": "figs"}))
    assert not result.is_error and _payload(result) == {"units": 12}
    # the prompt is the rollout's rehearse prompt with an empty history
    call = ToolCall("get_stock", {"item": "figs"})
    task = Task("mcp-client", "tools.json", ("",), tuple(TOOLS), {})
    ctx = RehearseContext(tools=tuple(TOOLS), task=task, grounded=False)
    messages = rehearse_messages(ctx, [], assistant_text([call]), call)
    assert sampler.prompts == [world.chat.prompt_ids(messages)]


@pytest.mark.timeout(60)
def test_a_rehearsed_error_is_an_mcp_tool_error_with_its_code(tokenizer):
    text = (
        '<execution_result>{"error": {"code": "TOOL_EXECUTION_ERROR", '
        '"message": "only 3 in stock"}}</execution_result>'
    )
    world, _ = _world(tokenizer, text)
    result = call_result(world.answer("remove_stock", {"item": "pears", "units": 9}))
    assert result.is_error
    assert _payload(result) == {
        "error": {"code": "TOOL_EXECUTION_ERROR", "message": "only 3 in stock"}
    }


@pytest.mark.timeout(60)
def test_an_unparseable_rehearsal_is_an_error_that_says_so(tokenizer):
    world, _ = _world(tokenizer, "the stock is fine")
    result = call_result(world.answer("get_stock", {"item": "figs"}))
    payload = _payload(result)
    assert result.is_error and isinstance(payload, dict)
    assert payload["error"]["code"] == UNPARSEABLE_REHEARSAL
    assert "MISSING_EXECUTION_RESULT" in payload["error"]["message"]
    assert payload["text"] == "the stock is fine"


@pytest.mark.timeout(60)
def test_refused_calls_never_reach_the_model(tokenizer):
    world, sampler = _world(tokenizer, "unused")
    result = call_result(world.answer("sell_stock", {}))
    assert result.is_error and sampler.prompts == []
    assert _payload(result) == {
        "error": {
            "code": "TOOL_NOT_AVAILABLE",
            "message": "no tool named 'sell_stock' is available; "
            "available tools: get_stock, remove_stock",
        }
    }


@pytest.mark.timeout(30)
def test_a_bad_tools_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"type": "function", "function": {"description": "x"}}]))
    with pytest.raises(ToolsFileError, match=r"tools\.json: tool 0"):
        load_tools(str(path))
    path.write_text(json.dumps([TOOLS[0], TOOLS[0]]))
    with pytest.raises(ToolsFileError, match="repeat"):
        load_tools(str(path))
    assert [t["function"]["name"] for t in load_tools_ok(tmp_path)] == ["get_stock"]


def load_tools_ok(tmp_path: Path) -> tuple[dict, ...]:
    """A ``{"tools": [...]}`` file is read as the bare list is."""
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"tools": [TOOLS[0]]}))
    return load_tools(str(path)).tools
