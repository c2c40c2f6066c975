"""The MCP suite against the real example server (envace_engine/environments/mcp/example):
tools from ``tools/list``, real calls and tool errors, state per episode, no leaked processes,
the task file's checks, and bad input that fails at load with a message naming the culprit."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.base import EnvironmentFault
from envace_engine.environments.check import check_suite
from envace_engine.environments.mcp.client import McpStartError
from envace_engine.environments.mcp.spec import SuiteFileError
from envace_engine.environments.mcp.suite import McpSuite
from envace_engine.tasks import TaskFileError
from envace_engine.types import StopReason, ToolCall
from tests.mcp_helpers import EXAMPLE, EXAMPLE_SUITE, SERVER_MODULE, server_pids, write_suite

pytestmark = pytest.mark.timeout(120)

TOOLS = {"list_items", "get_stock", "add_stock", "remove_stock"}


@pytest.fixture(scope="module")
def suite():
    return get_suite(EXAMPLE_SUITE)


def test_tools_come_from_the_servers_tools_list(suite):
    task = suite.tasks("train")[0]
    assert {t["function"]["name"] for t in task.tools} == TOOLS
    add = next(t for t in task.tools if t["function"]["name"] == "add_stock")["function"]
    assert add["parameters"]["required"] == ["item", "units"]
    assert add["parameters"]["properties"]["units"] == {"type": "integer"}
    assert "new total" in add["description"]  # the tool's docstring, through the SDK
    env = suite.make_env(task)
    try:
        assert env.tools() == list(task.tools)
    finally:
        env.close()


def test_a_real_call_and_a_tool_error(suite):
    env = suite.make_env(suite.tasks("train")[0])
    try:
        got = env.execute(ToolCall("get_stock", {"item": "apples"}))
        assert got.ok and got.value == {"item": "apples", "units": 5}
        refused = env.execute(ToolCall("remove_stock", {"item": "pears", "units": 9}))
        assert refused.error is not None and refused.error.code == "TOOL_EXECUTION_ERROR"
        assert "only 3 in stock" in refused.error.message  # the server's own isError text
        unknown = env.execute(ToolCall("get_stock", {"item": "kale"}))
        assert unknown.error is not None and "unknown item 'kale'" in unknown.error.message
        # The schema check answers before the server is asked, as every suite's does.
        bad = env.execute(ToolCall("add_stock", {"item": "figs"}))
        assert bad.error is not None and bad.error.code == "INVALID_PARAMETERS"
        assert env.execute(ToolCall("sell", {})).error.code == "TOOL_NOT_AVAILABLE"
        assert env.state()["calls"] == 3  # the three calls that reached the server
    finally:
        env.close()


def test_state_lasts_an_episode_and_each_episode_starts_fresh(suite):
    task = suite.tasks("train")[0]
    first = suite.make_env(task)
    try:
        assert first.execute(ToolCall("add_stock", {"item": "pears", "units": 4})).value == {
            "item": "pears",
            "units": 7,
        }
        assert first.execute(ToolCall("get_stock", {"item": "pears"})).value["units"] == 7
    finally:
        first.close()
    second = suite.make_env(task)
    try:
        assert second.execute(ToolCall("get_stock", {"item": "pears"})).value["units"] == 3
    finally:
        second.close()


def test_each_episode_has_its_own_process_and_close_ends_it(tmp_path):
    name, tag = write_suite(tmp_path)
    suite = get_suite(name)
    assert server_pids(tag) == []  # the listing server of the load is gone
    task = suite.tasks("train")[0]
    envs = [suite.make_env(task), suite.make_env(task)]
    try:
        assert len(server_pids(tag)) == 2
    finally:
        for env in envs:
            env.close()
    assert server_pids(tag) == []
    envs[0].close()  # idempotent


def test_reference_solutions_score_one_and_doing_nothing_scores_zero(suite):
    tasks = suite.tasks("validation")
    assert len(tasks) == 4 and len(suite.tasks("train")) == 8
    assert check_suite(suite, tasks).passed == 4
    assert check_suite(suite, tasks, "nothing").passed == 0
    # Reference results are in the task file: grounded rehearsal and SFT read them.
    assert tasks[0].reference_results == (({"item": "figs", "units": 12},),)


def test_partial_credit_counts_each_check(suite):
    task = next(t for t in suite.tasks("validation") if t.id == "inv-11")  # answer + probe
    add = ToolCall("add_stock", {"item": "figs", "units": 5})
    assert suite.score(task, [[add]], ["We have 17 figs."]) == 1.0
    assert suite.score(task, [[add]], ["Done."]) == 0.5
    assert suite.score(task, [[]], ["17"]) == 0.5


def test_an_unknown_split_names_the_splits(suite):
    with pytest.raises(ValueError, match=r"no split 'test'.*'train', 'validation'"):
        suite.tasks("test")


def test_an_unknown_tool_in_a_reference_call_names_file_and_line(tmp_path):
    lines = (EXAMPLE / "tasks.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["reference_calls"][0][0]["name"] = "sell_stock"
    lines[2] = json.dumps(bad)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    name, _ = write_suite(tmp_path, tasks=tasks)
    with pytest.raises(TaskFileError, match=rf"{tasks}:3: field 'reference_calls'.*sell_stock"):
        McpSuite(name, Path(name.removeprefix("mcp:")))


def test_a_task_without_a_success_check_names_file_and_line(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "x", "split": "train", "user_turns": ["hi"]}) + "\n")
    name, _ = write_suite(tmp_path, tasks=tasks)
    with pytest.raises(TaskFileError, match=rf"{tasks}:1: .*needs a success check"):
        McpSuite(name, Path(name.removeprefix("mcp:")))


def test_a_server_that_does_not_start_is_named(tmp_path):
    name, _ = write_suite(tmp_path, command="/nonexistent/mcp-server")
    with pytest.raises(McpStartError, match=r"`/nonexistent/mcp-server -m .*` failed to start"):
        McpSuite(name, Path(name.removeprefix("mcp:")))


def test_a_server_that_exits_at_once_is_named_with_its_stderr(tmp_path):
    path = tmp_path / "suite.toml"
    path.write_text(
        f'tasks = "{EXAMPLE / "tasks.jsonl"}"\n[server]\ncommand = "{sys.executable}"\n'
        'args = ["-c", "import sys; sys.exit(\'no database configured\')"]\n'
    )
    with pytest.raises(McpStartError, match=r"(?s)failed to start.*no database configured"):
        McpSuite(f"mcp:{path}", path)


def test_suite_file_errors_name_file_and_field(tmp_path):
    path = tmp_path / "suite.toml"
    path.write_text('tasks = "t.jsonl"\n[server]\ncommand = "x"\nargs = [1]\n')
    with pytest.raises(SuiteFileError, match=rf"{path}: field 'server.args.0'"):
        McpSuite(f"mcp:{path}", path)
    path.write_text('tasks = "t.jsonl"\n[server]\ncommand = "x"\nurl = "http://h/mcp"\n')
    with pytest.raises(SuiteFileError, match="exactly one of 'command'"):
        McpSuite(f"mcp:{path}", path)
    with pytest.raises(ValueError, match="one way to score"):
        get_suite(EXAMPLE_SUITE, "strict")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _url_suite(tmp_path: Path, url: str, server: str = "") -> Path:
    path = tmp_path / "http.toml"
    path.write_text(
        f'tasks = "{EXAMPLE / "tasks.jsonl"}"\n[server]\nurl = "{url}"\nstart_timeout_s = 10\n'
        + server
    )
    return path


@contextlib.contextmanager
def _http_server():
    """The example server over streamable HTTP (one shared inventory, with a reset tool)."""
    port = _free_port()
    command = [sys.executable, "-m", SERVER_MODULE, "--http", str(port)]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", server
    finally:
        server.terminate()
        server.wait(10)


def _figs_after_adding_one(suite: McpSuite) -> int:
    """Add a fig in one episode, then read the figs in the next."""
    task = suite.tasks("train")[0]
    env = suite.make_env(task)
    try:
        assert env.execute(ToolCall("add_stock", {"item": "figs", "units": 1})).ok
    finally:
        env.close()
    again = suite.make_env(task)
    try:
        return again.execute(ToolCall("get_stock", {"item": "figs"})).value["units"]
    finally:
        again.close()


def test_a_streamable_http_server_is_reached_by_url_and_reset_by_its_tool(tmp_path):
    with _http_server() as (url, server):
        plain = _url_suite(tmp_path, url)
        suite = McpSuite(f"mcp:{plain}", plain)
        # the reset tool is listed, and without reset_tool it is one more tool of the agent's
        assert {t["function"]["name"] for t in suite.tasks("train")[0].tools} == TOOLS | {"reset"}
        # without a reset tool the state carries from one episode to the next: adding 4 pears
        # and checking for 7 passes once (the score replays the calls on the shared server)
        assert _figs_after_adding_one(suite) == 13
        pears = suite.tasks("train")[1]
        solved = [list(turn) for turn in pears.reference_calls]
        assert [suite.score(pears, solved, []) for _ in range(2)] == [1.0, 0.0]
        path = _url_suite(tmp_path, url, 'reset_tool = "reset"\n')
        reset = McpSuite(f"mcp:{path}", path)
        task = reset.tasks("train")[0]
        assert {t["function"]["name"] for t in task.tools} == TOOLS  # hidden from the agent
        assert _figs_after_adding_one(reset) == 12  # each episode starts from the initial stock
        env = reset.make_env(task)
        try:
            said = env.execute(ToolCall("reset", {}))
            assert said.error is not None and said.error.code == "TOOL_NOT_AVAILABLE"
        finally:
            env.close()
        assert [reset.score(pears, solved, []) for _ in range(2)] == [1.0, 1.0]
        assert server.poll() is None  # closing an episode leaves a URL server running


def test_a_reset_tool_the_server_lacks_is_named(tmp_path):
    with _http_server() as (url, _):
        path = _url_suite(tmp_path, url, 'reset_tool = "restart"\n')
        with pytest.raises(
            SuiteFileError,
            match=r"http.toml: field 'server.reset_tool': the "
            r"server lists no tool 'restart'; its tools: add_stock",
        ):
            McpSuite(f"mcp:{path}", path)


def test_a_failing_reset_ends_the_episode_not_the_job(tmp_path):
    with _http_server() as (url, _):
        # a stock the reset tool refuses: the server answers with a tool error
        extra = 'reset_tool = "reset"\n[server.reset_arguments]\nstock = { apples = -1 }\n'
        path = _url_suite(tmp_path, url, extra)
        suite = McpSuite(f"mcp:{path}", path)
        env = suite.make_env(suite.tasks("train")[0])  # opening the episode does not raise
        try:
            with pytest.raises(
                EnvironmentFault, match=r"reset tool 'reset' failed: .*stock units must be 0"
            ) as got:
                env.execute(ToolCall("list_items", {}))
            assert got.value.stop is StopReason.ENV_MALFORMED
        finally:
            env.close()


def test_a_url_with_no_server_is_named(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    path = _url_suite(tmp_path, url)
    with pytest.raises(McpStartError, match=rf"MCP server `{url}` (failed to start|did not)"):
        McpSuite(f"mcp:{path}", path)
