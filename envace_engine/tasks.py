"""Task files: JSON Lines, one ``Task`` per line, validated with pydantic (schema: docs/tasks.md).

``load_tasks`` reads the whole file, validates every line and either returns every task or
raises ``TaskFileError`` listing each bad line and field (``tasks.jsonl:3: field
'user_turns.0': Input should be a valid string``) — never a partial list. ``save_tasks``
writes to a temporary sibling and renames it, so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envace_engine.types import Task, ToolCall

MAX_REPORTED = 10  # errors listed in one TaskFileError


class TaskFileError(ValueError):
    """A task file failed validation; ``errors`` holds one ``path:line: ...`` string each."""

    def __init__(self, path: str, errors: list[str], total: int) -> None:
        self.errors = errors
        more = f"\n... and {total - len(errors)} more" if total > len(errors) else ""
        super().__init__(
            f"{path}: {total} invalid line(s), nothing loaded:\n" + "\n".join(errors) + more
        )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionModel(_Strict):
    """The ``function`` part of an OpenAI tool schema."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type", "object") != "object":
            raise ValueError("must be a JSON Schema with type 'object'")
        return value


class ToolModel(_Strict):
    """An OpenAI tool schema: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionModel


class CallModel(_Strict):
    """A reference call: tool name and JSON arguments."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw: str = ""  # the text the call came from (BFCL's ground-truth string), if any


class TaskModel(_Strict):
    """One line of a task file."""

    id: str = Field(min_length=1)
    suite: str = Field(min_length=1)
    user_turns: list[str] = Field(min_length=1)
    tools: list[ToolModel]
    initial_state: dict[str, Any]
    reference_calls: list[list[CallModel]] = Field(default_factory=list)
    reference_results: list[list[Any]] = Field(default_factory=list)
    system: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shapes_agree(self) -> TaskModel:
        turns = len(self.user_turns)
        if self.reference_calls and len(self.reference_calls) != turns:
            raise ValueError(
                f"field 'reference_calls': {len(self.reference_calls)} turns, user_turns {turns}"
            )
        if self.reference_results:
            shape = [len(t) for t in self.reference_calls]
            got = [len(t) for t in self.reference_results]
            if got != shape:
                raise ValueError(
                    f"field 'reference_results': shape {got} does not match reference_calls {shape}"
                )
        names = {t.function.name for t in self.tools}
        later = self.meta.get("missed_function", {})  # BFCL tools that arrive at a later turn
        if isinstance(later, dict):
            names |= {n for group in later.values() if isinstance(group, list) for n in group}
        for turn, calls in enumerate(self.reference_calls):
            for call in calls:
                if call.name not in names:
                    raise ValueError(
                        f"field 'reference_calls.{turn}': {call.name!r} is not in tools"
                    )
        return self


def _call_to_dict(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"name": call.name, "arguments": call.arguments}
    if call.raw:
        out["raw"] = call.raw
    return out


def task_to_dict(task: Task) -> dict[str, Any]:
    """A task as the JSON object of one task-file line."""
    return {
        "id": task.id,
        "suite": task.suite,
        "user_turns": list(task.user_turns),
        "tools": list(task.tools),
        "initial_state": task.initial_state,
        "reference_calls": [[_call_to_dict(c) for c in turn] for turn in task.reference_calls],
        "reference_results": [list(turn) for turn in task.reference_results],
        "system": task.system,
        "meta": task.meta,
    }


def task_from_model(model: TaskModel, raw: dict[str, Any]) -> Task:
    """The ``Task`` of a validated line (tool schemas kept exactly as written in ``raw``)."""
    return Task(
        id=model.id,
        suite=model.suite,
        user_turns=tuple(model.user_turns),
        tools=tuple(raw["tools"]),
        initial_state=model.initial_state,
        reference_calls=tuple(
            tuple(ToolCall(c.name, c.arguments, c.raw) for c in turn)
            for turn in model.reference_calls
        ),
        reference_results=tuple(tuple(turn) for turn in model.reference_results),
        system=model.system,
        meta=model.meta,
    )


def describe_errors(error: ValidationError) -> list[str]:
    """One ``field 'a.b': message`` per pydantic error (task files, suite files)."""
    out = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"])
        # Our own validators' messages, without pydantic's "Value error, " prefix.
        msg = str(item["ctx"]["error"]) if item["type"] == "value_error" else item["msg"]
        out.append(f"field '{where}': {msg}" if where else msg)
    return out


def parse_lines(lines: Iterable[str], path: str = "<tasks>") -> list[Task]:
    """Validate task-file lines (blank lines skipped); all tasks, or ``TaskFileError``."""
    tasks: list[Task] = []
    errors: list[str] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as err:
            errors.append(f"{path}:{number}: not valid JSON: {err.msg} (column {err.colno})")
            continue
        try:
            model = TaskModel.model_validate(data)
        except ValidationError as err:
            errors += [f"{path}:{number}: {msg}" for msg in describe_errors(err)]
            continue
        if model.id in first_line:
            errors.append(
                f"{path}:{number}: field 'id': duplicate task id {model.id!r} "
                f"(first on line {first_line[model.id]})"
            )
            continue
        first_line[model.id] = number
        tasks.append(task_from_model(model, data))
    if errors:
        raise TaskFileError(path, errors[:MAX_REPORTED], len(errors))
    return tasks


def load_tasks(path: str | Path) -> list[Task]:
    """Read and validate a task file; every task or ``TaskFileError`` (nothing half-loaded)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"task file {file} does not exist")
    with file.open(encoding="utf-8") as handle:
        return parse_lines(handle, str(file))


def save_tasks(tasks: Iterable[Task], path: str | Path) -> int:
    """Write tasks as JSON Lines atomically; returns how many were written."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp{os.getpid()}")
    count = 0
    with tmp.open("w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(task_to_dict(task), ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(file)
    return count
