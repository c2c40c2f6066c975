"""Task files: round trip, and malformed files rejected whole with exact line/field messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from envace_engine.environments import get_suite
from envace_engine.tasks import TaskFileError, load_tasks, parse_lines, save_tasks

GOOD = {
    "id": "t1",
    "suite": "toy",
    "user_turns": ["Add 2 pens."],
    "tools": [
        {
            "type": "function",
            "function": {"name": "add_stock", "parameters": {"type": "object", "properties": {}}},
        }
    ],
    "initial_state": {"stock": {"pens": 1}},
    "reference_calls": [[{"name": "add_stock", "arguments": {"item": "pens", "qty": 2}}]],
    "reference_results": [[{"item": "pens", "qty": 3}]],
}


def _lines(bad: str) -> list[str]:
    return [json.dumps(GOOD), bad]


def _bad(**change: object) -> str:
    return json.dumps({**GOOD, **change})


def test_round_trip_of_every_suite(tmp_path: Path) -> None:
    tasks = get_suite("toy").tasks("train")[:20] + get_suite("bfcl-gen").tasks("train")[:20]
    tasks += get_suite("bfcl").tasks("miss_func")[:5]
    path = tmp_path / "tasks.jsonl"
    assert save_tasks(tasks, path) == len(tasks)
    assert load_tasks(path) == tasks
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed away


MALFORMED = [
    (
        '{"id": "x",',
        "f.jsonl:2: not valid JSON: Expecting property name enclosed in double quotes (column 12)",
    ),
    (
        json.dumps({k: v for k, v in GOOD.items() if k != "user_turns"}),
        "f.jsonl:2: field 'user_turns': Field required",
    ),
    (_bad(user_turns=[3]), "f.jsonl:2: field 'user_turns.0': Input should be a valid string"),
    (
        _bad(user_turns=[]),
        "f.jsonl:2: field 'user_turns': List should have at least 1 item after validation, not 0",
    ),
    (_bad(colour="red"), "f.jsonl:2: field 'colour': Extra inputs are not permitted"),
    (
        _bad(tools=[{"type": "fn", "function": {"name": "f"}}]),
        "f.jsonl:2: field 'tools.0.type': Input should be 'function'",
    ),
    (
        _bad(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]
        ),
        "f.jsonl:2: field 'tools.0.function.parameters': must be a JSON Schema with type 'object'",
    ),
    (
        _bad(reference_calls=[[{"name": "add_stock", "arguments": "{}"}]]),
        "f.jsonl:2: field 'reference_calls.0.0.arguments': Input should be a valid dictionary",
    ),
    (
        _bad(reference_calls=[[], []], reference_results=[]),
        "f.jsonl:2: field 'reference_calls': 2 turns, user_turns 1",
    ),
    (
        _bad(reference_results=[[1, 2]]),
        "f.jsonl:2: field 'reference_results': shape [2] does not match reference_calls [1]",
    ),
    (
        _bad(reference_calls=[[{"name": "steal", "arguments": {}}]]),
        "f.jsonl:2: field 'reference_calls.0': 'steal' is not in tools",
    ),
    (json.dumps(GOOD), "f.jsonl:2: field 'id': duplicate task id 't1' (first on line 1)"),
]


@pytest.mark.parametrize(("line", "message"), MALFORMED)
def test_malformed_line_is_named_exactly(line: str, message: str) -> None:
    with pytest.raises(TaskFileError) as caught:
        parse_lines(_lines(line), "f.jsonl")
    assert caught.value.errors == [message]
    assert str(caught.value) == f"f.jsonl: 1 invalid line(s), nothing loaded:\n{message}"


def test_every_bad_line_is_reported_and_nothing_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), "[1, 2", "", _bad(id="t2", suite="")]) + "\n")
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    assert caught.value.errors == [
        f"{path}:2: not valid JSON: Expecting ',' delimiter (column 6)",
        f"{path}:4: field 'suite': String should have at least 1 character",
    ]


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl does not exist"):
        load_tasks(tmp_path / "nope.jsonl")


def test_cli_generate_show_and_list(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "gen.jsonl"
    done = runner.invoke(
        app,
        ["tasks", "generate", "--suite", "bfcl-gen", "--n", "7", "--seed", "3", "--out", str(out)],
    )
    assert done.exit_code == 0, done.output
    assert "wrote 7 bfcl-gen tasks" in done.output
    assert [t.id for t in load_tasks(out)] == [f"bfcl-gen/s3-{i}" for i in range(7)]
    shown = runner.invoke(app, ["tasks", "show", str(out), "--index", "2"])
    assert shown.exit_code == 0, shown.output
    task = load_tasks(out)[2]
    assert f"task {task.id}" in shown.output
    assert task.user_turns[0] in shown.output
    assert f"-> {task.reference_calls[0][0].name}(" in shown.output
    past_end = runner.invoke(app, ["tasks", "show", str(out), "--index", "7"])
    assert past_end.exit_code == 2
    assert f"error: --index 7: {out} has 7 tasks (0..6)" in past_end.output
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    broken = runner.invoke(app, ["tasks", "show", str(tmp_path / "bad.jsonl")])
    assert broken.exit_code == 2
    assert (
        f"{tmp_path / 'bad.jsonl'}:1: field 'id': Input should be a valid string" in broken.output
    )
    listed = runner.invoke(app, ["tasks", "list"])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in listed.output.splitlines()}
    assert rows["toy"] == "train 512, validation 64"
    assert rows["bfcl"].startswith("test 800, base 200")
    assert rows["vita-delivery-en"] == "test 100"
    # names padded to the longest, so the counts line up
    lines = listed.output.splitlines()
    assert len({line.index(rows[name]) for name, line in zip(rows, lines, strict=True)}) == 1
