"""``report_to``: a real tiny training run logs its metrics to trackio (local, offline), and a
few episodes per step go to the tracker as traces, each call with its rehearsed and real answer.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from envace_engine.fidelity.metrics import compare
from envace_engine.tracking import (
    CALL_COLUMNS,
    EpisodeTrace,
    ModuleTracker,
    TrackingSink,
    agree,
    episode_trace,
    open_tracker,
    pick_evenly,
    trace_messages,
    tracker_note,
)
from envace_engine.types import (
    CallRecord,
    Episode,
    MetaKey,
    Mode,
    Rehearsal,
    Role,
    Segment,
    ToolCall,
    ToolError,
    ToolResult,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def _logged(db: Path, run: str) -> dict[int, dict[str, float]]:
    """Each step's stored metrics (a step's traces are logged apart, with no metrics)."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metrics FROM metrics WHERE run_name = ?", (run,))
        out: dict[int, dict[str, float]] = {}
        for step, body in rows:
            out.setdefault(step, {}).update(json.loads(body))
        return out


def train_reporting(tmp_path: Path, run_id: str, *more: str) -> Path:
    """Run a tiny training run reporting to trackio in a fresh process (trackio reads
    TRACKIO_DIR once, at import); returns the trackio folder."""
    folder = tmp_path / "trackio"
    args = ["train", "--config", str(CONFIGS / "tiny-test.toml"), "--set", "report_to=trackio"]
    extra = ["--set", f"root={tmp_path / 'root'}", "--set", f"run_id={run_id}", *more]
    env = {**os.environ, "TRACKIO_DIR": str(folder)}
    cmd = [sys.executable, "-m", "envace_engine.cli", *args, *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder


def _traced(db: Path, run: str) -> dict[int, list[dict[str, Any]]]:
    """Each step's stored trace metadata."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metadata FROM traces WHERE run_name = ?", (run,))
        out: dict[int, list[dict[str, Any]]] = {}
        for step, body in rows:
            out.setdefault(step, []).append(json.loads(body))
        return out


def test_a_training_run_reports_every_step_to_trackio(tmp_path):
    train_reporting(tmp_path, "tracked")
    db = tmp_path / "trackio" / "envace.db"
    logged = _logged(db, "tracked")
    assert sorted(logged) == [0, 1]  # tiny-test.toml: 2 steps
    assert all("loss" in m and "reward/mean" in m for m in logged.values())
    traced = _traced(db, "tracked")  # trace_episodes = 2 of the step's 2 tasks x 2
    assert {step: len(traces) for step, traces in traced.items()} == {0: 2, 1: 2}
    assert all(t["step"] == step for step, traces in traced.items() for t in traces)
    stored = json.loads((tmp_path / "root" / "runs" / "tracked" / "run.json").read_text())
    assert stored["config"]["report_to"] == "trackio"


def test_unknown_or_missing_trackers_name_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert open_tracker("none", "p", "r", {}) is None
    with pytest.raises(ValueError, match="choose one of none, trackio, wandb"):
        open_tracker("mlflow", "p", "r", {})
    with pytest.raises(ValueError, match="pip install wandb"):
        open_tracker("wandb", "p", "r", {})


# -- traces: a few episodes per step, each call with its rehearsed and its real answer --------

CALL_0 = '{"name": "get_balance", "arguments": {"account": 7}}'
CALL_1 = '{"name": "close_account", "arguments": {"account": 7}}'
LOCKED = ToolError("ACCOUNT_LOCKED", "account 7 is locked")


def _segment(role: Role, text: str) -> Segment:
    logprobs = (-0.5,) if role.trained else None
    return Segment(role, (1,), text, logprobs)


def _rehearsal(index: int, text: str) -> Rehearsal:
    return Rehearsal(index, (1,), _segment(Role.REHEARSE, text + "<|im_end|>"), grounded=False)


def banking_episode(episode_id: str = "ep-1", task_id: str = "bank-7") -> Episode:
    """Two calls in a rehearsal run with a shadow environment: the first rehearsed as the real
    tool answered it, the second rehearsed as a success where the real tool refused."""
    tool = "<|im_end|>\n<|im_start|>tool\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
    return Episode(
        id=episode_id,
        task_id=task_id,
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id="g-1",
        segments=(
            _segment(Role.PROMPT, "What is the balance of account 7? Then close it."),
            _segment(Role.ACT, f"<tool_call>\n{CALL_0}\n</tool_call><|im_end|>"),
            _segment(Role.TOOL, tool + "<|im_start|>assistant\n"),
            _segment(Role.ACT, f"Now closing.\n<tool_call>\n{CALL_1}\n</tool_call><|im_end|>"),
            _segment(Role.TOOL, tool + "<|im_start|>assistant\n"),
            _segment(Role.ACT, "The balance is 100; account 7 is locked.<|im_end|>"),
        ),
        rehearsals=(_rehearsal(0, '{"balance": 100}'), _rehearsal(1, '{"closed": true}')),
        calls=(
            CallRecord(
                0,
                1,
                ToolCall("get_balance", {"account": 7}, CALL_0),
                "rehearsed",
                rehearsed=ToolResult({"balance": 100}),
                real=ToolResult({"balance": 100}),
            ),
            CallRecord(
                0,
                2,
                ToolCall("close_account", {"account": 7}, CALL_1),
                "rehearsed",
                rehearsed=ToolResult({"closed": True}),
                real=ToolResult(error=LOCKED),
            ),
        ),
        reward=0.5,
        final_answers=("The balance is 100; account 7 is locked.",),
        meta={MetaKey.BUDGET: 1, MetaKey.REHEARSAL_MODE: "parallel", MetaKey.SAMPLED_TOKENS: 9},
    )


def _tool_call(index: int, name: str) -> dict[str, Any]:
    function = {"name": name, "arguments": '{"account": 7}'}
    return {"id": f"call_{index}", "type": "function", "function": function}


LOCKED_JSON = {"error": {"code": "ACCOUNT_LOCKED", "message": "account 7 is locked"}}


def test_an_episode_becomes_chat_messages_with_the_real_answers():
    assert trace_messages(banking_episode()) == [
        {"role": "user", "content": "What is the balance of account 7? Then close it."},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call(0, "get_balance")]},
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "name": "get_balance",
            "content": '{"balance": 100}',
        },
        {
            "role": "assistant",
            "content": "Now closing.",
            "tool_calls": [_tool_call(1, "close_account")],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "close_account",
            "content": json.dumps(LOCKED_JSON),
        },
        {"role": "assistant", "content": "The balance is 100; account 7 is locked."},
    ]


def test_each_call_is_a_tool_span_with_its_rehearsed_and_real_answer():
    trace = episode_trace(banking_episode(), step=3)
    assert trace.spans == (
        {
            "id": "call_0",
            "name": "get_balance",
            "kind": "tool",
            "input": {"account": 7},
            "output": {"balance": 100},
            "status": "success",
            "metadata": {
                "turn": 0,
                "agent_step": 1,
                "shown": "rehearsed",
                "real": {"balance": 100},
                "real_status": "success",
                "rehearsed": {"balance": 100},
                "rehearsed_status": "success",
                "agree": True,
                "rehearsed_text": '{"balance": 100}',
            },
        },
        {
            "id": "call_1",
            "name": "close_account",
            "kind": "tool",
            "input": {"account": 7},
            "output": LOCKED_JSON,
            "status": "error",
            "error": "ACCOUNT_LOCKED: account 7 is locked",
            "metadata": {
                "turn": 0,
                "agent_step": 2,
                "shown": "rehearsed",
                "real": LOCKED_JSON,
                "real_status": "error",
                "rehearsed": {"closed": True},
                "rehearsed_status": "success",
                "agree": False,
                "rehearsed_text": '{"closed": true}',
            },
        },
    )
    assert trace.metadata == {
        "episode_id": "ep-1",
        "task_id": "bank-7",
        "suite": "toy",
        "mode": "rehearsal",
        "step": 3,
        "reward": 0.5,
        "stop_reason": "done",
        "budget": 1,
        "rehearsal_mode": "parallel",
        "calls_agreeing": "1/2",
    }
    assert trace.messages == tuple(trace_messages(banking_episode()))


def test_a_real_only_call_has_no_rehearsed_fields():
    real_only = replace(
        banking_episode(),
        mode=Mode.REAL,
        rehearsals=(),
        calls=tuple(replace(c, shown="real", rehearsed=None) for c in banking_episode().calls),
    )
    spans = episode_trace(real_only, step=0).spans
    assert [s["metadata"] for s in spans] == [
        {
            "turn": 0,
            "agent_step": 1,
            "shown": "real",
            "real": {"balance": 100},
            "real_status": "success",
        },
        {"turn": 0, "agent_step": 2, "shown": "real", "real": LOCKED_JSON, "real_status": "error"},
    ]
    assert "calls_agreeing" not in episode_trace(real_only, step=0).metadata


@pytest.mark.parametrize(
    ("rehearsed", "real"),
    [
        (ToolResult({"a": 1, "b": [1, 2]}), ToolResult({"b": [1, 2], "a": 1})),
        (ToolResult({"a": 1}), ToolResult({"a": 1.0})),
        (ToolResult({"a": 1}), ToolResult({"a": 2})),
        (ToolResult(error=LOCKED), ToolResult(error=LOCKED)),
        (ToolResult(error=LOCKED), ToolResult(error=ToolError("ACCOUNT_LOCKED", "other"))),
        (ToolResult(LOCKED_JSON), ToolResult(error=LOCKED)),  # an ok value mimicking an error
        (ToolResult(None), ToolResult(None)),
    ],
)
def test_agreement_is_the_fidelity_exact_tier(rehearsed, real):
    assert agree(rehearsed, real) == compare(rehearsed, real).exact


def test_episodes_are_picked_evenly_so_they_come_from_different_tasks():
    assert pick_evenly(list(range(16)), 2) == [0, 8]  # 4 tasks x group of 4: tasks 0 and 2
    assert pick_evenly(list(range(16)), 4) == [0, 4, 8, 12]
    assert pick_evenly(list(range(10)), 3) == [0, 3, 6]
    assert pick_evenly(list(range(3)), 5) == [0, 1, 2]
    assert pick_evenly(list(range(5)), 0) == []
    assert pick_evenly([], 2) == []


def test_wandb_gets_one_table_row_per_call():
    logged: list[tuple[dict[str, Any], int]] = []
    wandb = types.ModuleType("wandb")
    wandb.Table = lambda columns, data: {"columns": columns, "data": data}
    wandb.log = lambda values, step: logged.append((values, step))
    ModuleTracker(wandb).log_traces([episode_trace(banking_episode(), 5)], 5)
    [(values, step)] = logged
    assert step == 5
    assert values["tool_calls"] == {
        "columns": list(CALL_COLUMNS),
        "data": [
            [
                "ep-1",
                0,
                "get_balance",
                '{"account": 7}',
                '{"balance": 100}',
                '{"balance": 100}',
                True,
            ],
            [
                "ep-1",
                0,
                "close_account",
                '{"account": 7}',
                '{"closed": true}',
                json.dumps(LOCKED_JSON),
                False,
            ],
        ],
    }


@dataclass
class Recorder:
    """A ``Sink`` and a ``Tracker`` that record what they get; ``broken`` refuses traces."""

    broken: bool = False
    got: list[tuple[str, int, Any]] = field(default_factory=list)

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        self.got.append(("episodes", step, [e.id for e in episodes]))

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.got.append(("metrics", step, dict(metrics)))

    def progress(self, done: int, total: int, message: str = "") -> None:
        self.got.append(("progress", done, message))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.got.append(("log", step, dict(metrics)))

    def log_traces(self, traces: Sequence[EpisodeTrace], step: int) -> None:
        if self.broken:
            raise ConnectionError("tracker unreachable")
        self.got.append(("traces", step, [t.metadata["task_id"] for t in traces]))

    def finish(self) -> None:
        self.got.append(("finish", 0, None))


def _step_of(tasks: int, group: int) -> list[Episode]:
    return [banking_episode(f"ep-{t}-{g}", f"task-{t}") for t in range(tasks) for g in range(group)]


def test_the_sink_forwards_then_traces_a_few_episodes_per_step():
    inner, tracker = Recorder(), Recorder()
    sink = TrackingSink(inner, tracker, trace_episodes=2)
    sink.episodes(4, _step_of(tasks=3, group=2))
    sink.metrics(4, {"loss": 1.0})
    assert inner.got == [
        ("episodes", 4, [f"ep-{t}-{g}" for t in range(3) for g in range(2)]),
        ("metrics", 4, {"loss": 1.0}),
    ]
    assert tracker.got == [("traces", 4, ["task-0", "task-1"]), ("log", 4, {"loss": 1.0})]
    off = Recorder()
    TrackingSink(Recorder(), off, trace_episodes=0).episodes(0, _step_of(2, 2))
    assert off.got == []


def test_a_tracker_refusing_traces_warns_once_and_training_goes_on(caplog):
    inner = Recorder()
    sink = TrackingSink(inner, Recorder(broken=True), trace_episodes=1)
    with caplog.at_level(logging.WARNING, logger="envace_engine.tracking"):
        for step in range(3):
            sink.episodes(step, _step_of(1, 1))
            sink.metrics(step, {"loss": 0.0})
    assert [r.getMessage() for r in caplog.records] == [
        "tracker: step 0's traces not logged (ConnectionError('tracker unreachable')); metrics "
        "still are, and later trace failures are not reported again"
    ]
    assert [kind for kind, _, _ in inner.got] == ["episodes", "metrics"] * 3
    assert sink.failed == [0, 1, 2]


def test_the_studio_note_says_where_the_tracker_copy_is():
    run = "train-20250101-000000"
    assert tracker_note({"report_to": "trackio", "trace_episodes": 2}, run) == (
        f"Traces and metrics also in trackio: project `envace`, run `{run}` — "
        "`trackio show --project envace`"
    )
    assert tracker_note({"report_to": "wandb"}, run) == (
        f"Traces and metrics also in Weights & Biases: project `envace`, run `{run}`"
    )
    assert tracker_note({"report_to": "trackio", "trace_episodes": 0}, run).startswith(
        "Metrics also in trackio"
    )
    assert tracker_note({"report_to": "none"}, run) == ""
    assert tracker_note({}, run) == ""


# Run in a fresh process: trackio reads TRACKIO_DIR once, at import, into several modules.
ROUND_TRIP = """
import json, sys
from envace_engine.sink import JsonlSink
from envace_engine.tracking import TrackingSink, open_tracker
from tests.test_tracking import banking_episode

tracker = open_tracker("trackio", "envace", "traced", {"report_to": "trackio"})
sink = TrackingSink(JsonlSink(sys.argv[1]), tracker, trace_episodes=2)
sink.episodes(0, [banking_episode("ep-a", "task-a"), banking_episode("ep-b", "task-b")])
sink.metrics(0, {"loss": 1.0})
tracker.finish()

from trackio.sqlite_storage import SQLiteStorage
print(json.dumps(SQLiteStorage.get_traces("envace", run="traced", sort="step_asc")))
"""


def test_traces_reach_trackio_and_read_back(tmp_path):
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    cmd = [sys.executable, "-c", ROUND_TRIP, str(tmp_path / "out")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    traces = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(t["metadata"]["task_id"] for t in traces) == ["task-a", "task-b"]
    assert {(t["key"], t["step"]) for t in traces} == {("traces", 0)}
    spans = {s["name"]: s for s in traces[0]["spans"]}
    assert spans["close_account"]["metadata"]["rehearsed"] == {"closed": True}
    assert spans["close_account"]["metadata"]["real"] == LOCKED_JSON
    assert spans["close_account"]["status"] == "error"
    assert spans["get_balance"]["metadata"]["agree"] is True
    tool = [m for m in traces[0]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool] == ['{"balance": 100}', json.dumps(LOCKED_JSON)]
    assert _logged(tmp_path / "trackio" / "envace.db", "traced") == {0: {"loss": 1.0}}
