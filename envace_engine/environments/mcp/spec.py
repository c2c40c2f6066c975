"""The MCP suite's two files: the suite file (TOML or JSON) and its task file (JSON Lines).

Both are validated with pydantic; every error names the file and the field (and, in the task
file, the line): ``suite.toml: field 'server.args.0': Input should be a valid string``,
``tasks.jsonl:3: field 'user_turns': Field required``. Formats: docs/mcp.md.
"""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envace_engine.environments.mcp.client import ServerSpec
from envace_engine.tasks import MAX_REPORTED, TaskFileError, describe_errors

PYTHON = "{python}"  # in a server command: the interpreter running EnvACE (sys.executable)


class SuiteFileError(ValueError):
    """A suite file that cannot be read or does not validate."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ServerModel(_Strict):
    """``[server]``: a stdio ``command`` (with ``args``, ``env``, ``cwd``) or an HTTP ``url``."""

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None  # relative to the suite file's folder (default: that folder)
    url: str | None = Field(default=None, pattern=r"^https?://")
    call_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    start_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # a tool called when each episode's session opens, hidden from the agent (docs/mcp.md)
    reset_tool: str | None = Field(default=None, min_length=1)
    reset_arguments: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_way_in(self) -> ServerModel:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of 'command' (stdio) and 'url' (streamable HTTP)")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("'args', 'env' and 'cwd' apply to a 'command' server, not a 'url'")
        return self


class SuiteModel(_Strict):
    """A suite file."""

    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$")
    tasks: str = Field(min_length=1)  # the task file, relative to the suite file
    system: str = ""  # context text opening every task's first user message (unless its own)
    server: ServerModel


class RefCallModel(_Strict):
    """A reference call with the result the real server gave it."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any


class ProbeModel(_Strict):
    """A state check: a call run after the agent's calls, and the result it must give."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any


class McpTaskModel(_Strict):
    """One line of an MCP task file."""

    id: str = Field(min_length=1)
    split: str = Field(min_length=1)
    user_turns: list[str] = Field(min_length=1)
    system: str | None = None
    reference_calls: list[list[RefCallModel]] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)  # per turn: text the answer must contain
    state: list[ProbeModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shapes(self) -> McpTaskModel:
        turns = len(self.user_turns)
        if self.reference_calls and len(self.reference_calls) != turns:
            raise ValueError(f"'reference_calls' has {len(self.reference_calls)} turns, {turns}")
        if len(self.answers) > turns:
            raise ValueError(f"'answers' has {len(self.answers)} entries for {turns} user turns")
        if not any(self.answers) and not self.state:
            raise ValueError("a task needs a success check: non-empty 'answers' or 'state'")
        return self


def read_suite_file(path: Path) -> SuiteModel:
    """Parse and validate a suite file (``.toml`` or ``.json``)."""
    if not path.is_file():
        raise SuiteFileError(f"MCP suite file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as err:  # TOMLDecodeError is a ValueError
        raise SuiteFileError(f"{path}: cannot be read as {path.suffix or 'TOML'}: {err}") from err
    try:
        return SuiteModel.model_validate(data)
    except ValidationError as err:
        raise SuiteFileError(f"{path}: " + "; ".join(describe_errors(err))) from err


def server_spec(model: ServerModel, folder: Path) -> ServerSpec:
    """The connection settings, with ``{python}`` and relative paths resolved."""
    base = ServerSpec(
        call_timeout_s=model.call_timeout_s,
        start_timeout_s=model.start_timeout_s,
        reset_tool=model.reset_tool,
        reset_arguments=dict(model.reset_arguments),
    )
    if model.url is not None:
        return replace(base, url=model.url)
    command = sys.executable if model.command == PYTHON else model.command
    cwd = (folder / model.cwd) if model.cwd is not None else folder
    args, env = tuple(model.args), dict(model.env)
    return replace(base, command=command, args=args, env=env, cwd=str(cwd.resolve()))


def read_task_file(path: Path) -> list[tuple[int, McpTaskModel]]:
    """Every line's task with its line number, or ``TaskFileError`` listing each bad line."""
    if not path.is_file():
        raise TaskFileError(str(path), [f"{path}: task file does not exist"], 1)
    tasks: list[tuple[int, McpTaskModel]] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            model = McpTaskModel.model_validate(json.loads(line))
        except json.JSONDecodeError as err:
            errors.append(f"{path}:{number}: not valid JSON: {err.msg} (column {err.colno})")
            continue
        except ValidationError as err:
            errors += [f"{path}:{number}: {msg}" for msg in describe_errors(err)]
            continue
        if model.id in seen:
            errors.append(f"{path}:{number}: field 'id': duplicate of line {seen[model.id]}")
            continue
        seen[model.id] = number
        tasks.append((number, model))
    if errors:
        raise TaskFileError(str(path), errors[:MAX_REPORTED], len(errors))
    return tasks
