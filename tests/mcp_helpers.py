"""Helpers of the MCP suite's tests: suite files for the example server (and its misbehaving
variants), finding a test's server processes, and a scripted agent that plays the reference."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from envace_engine.types import Task

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "envace_engine" / "environments" / "mcp" / "example"
EXAMPLE_SUITE = f"mcp:{EXAMPLE / 'suite.toml'}"
SERVER_MODULE = "envace_engine.environments.mcp.example.server"
TAG_VAR = "ENVACE_MCP_TEST_TAG"  # set in a test's server environment to find its processes


def write_suite(
    folder: Path,
    *,
    args: Sequence[str] = (),
    tasks: Path = EXAMPLE / "tasks.jsonl",
    call_timeout_s: float = 10,
    command: str = "{python}",
) -> tuple[str, str]:
    """A suite file for the example server (``args`` appended: a fault); its ``mcp:`` name and
    the tag its server processes carry in their environment."""
    tag = uuid.uuid4().hex
    server = {
        "command": command,
        "args": ["-m", SERVER_MODULE, *args],
        "env": {TAG_VAR: tag},
        "call_timeout_s": call_timeout_s,
        "start_timeout_s": 30,
    }
    suite = {"name": "inventory-test", "tasks": str(tasks), "server": server}
    path = folder / f"suite-{tag[:8]}.json"
    path.write_text(json.dumps(suite), encoding="utf-8")
    return f"mcp:{path}", tag


def server_pids(tag: str) -> list[int]:
    """Live processes started with ``tag`` in their environment (our own user's only)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue  # gone, or not ours
        zombie = re.search(r"^State:\s+Z", status, re.M) is not None
        if f"{TAG_VAR}={tag}".encode() in environ.split(b"\0") and not zombie:
            pids.append(int(entry.name))
    return [p for p in pids if p != os.getpid()]


def reference_agent(tasks: Sequence[Task]):
    """A script for ``ScriptedSampler``: makes the task's reference calls of the current user
    turn one reply at a time, then gives the task's expected answer (or "Done.")."""
    from envace_engine.rollout.prompts import call_text

    def script(prompt: str) -> str:
        task = next(t for t in tasks if t.user_turns[0] in prompt)
        turn = max(i for i, text in enumerate(task.user_turns) if text in prompt)
        since = prompt.rsplit(task.user_turns[turn], 1)[1]
        done = since.count("<|im_start|>tool")  # this turn's tool messages so far
        calls = task.reference_calls[turn]
        if done < len(calls):
            return call_text(calls[done])
        answers = task.meta.get("answers") or []
        return (answers[turn] if turn < len(answers) else "") or "Done."

    return script
