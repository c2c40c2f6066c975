"""Experiment tracking: a run's metrics, and a few of its episodes as traces, also go to trackio
or Weights & Biases (``report_to``).

``TrackingSink`` wraps a job's ``Sink``: everything is forwarded, every ``metrics`` call is also
logged to the tracker at its step, and of every ``episodes`` call a few episodes
(``trace_episodes``, picked evenly through the step so they come from different tasks) are
logged as traces. trackio (local-first: a SQLite file under ``$TRACKIO_DIR``, default
``~/.cache/huggingface/trackio``, shown by ``trackio show``) and wandb are imported only when
chosen; a missing package is an error naming what to install. The run's config goes to the
tracker once, at ``init``.

A trace is the episode as an OpenAI-style chat (the agent's replies with their ``tool_calls``,
each answered by a ``tool`` message holding the real environment's answer) plus one ``tool``
span per call whose metadata holds the world role's rehearsed answer beside the real one: the
pair a reader wants to compare. trackio stores the trace as such; wandb gets one table row per
call. The traces are a window onto the run, never its record (the run's Parquet shards are):
a tracker failing on them is logged once and training goes on.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, get_args

from envace_engine.chat_text import clean_text
from envace_engine.config import ReportTo
from envace_engine.sink import Sink
from envace_engine.types import CallRecord, Episode, MetaKey, Role, ToolResult

LOG = logging.getLogger(__name__)
REPORT_TO: tuple[str, ...] = get_args(ReportTo)
PROJECT = "envace"  # every run's tracker project; the run id is the tracker run's name
TRACE_KEY = "traces"  # trackio: the step's traces, one list under this key
TABLE_KEY = "tool_calls"  # wandb: the step's calls, one table under this key
CALL_COLUMNS = ("episode", "turn", "tool", "arguments", "rehearsed", "real", "agree")

T = TypeVar("T")


@dataclass(frozen=True)
class EpisodeTrace:
    """One episode as a tracker trace: chat ``messages``, trace ``metadata``, tool ``spans``."""

    messages: tuple[dict[str, Any], ...]
    metadata: dict[str, Any]
    spans: tuple[dict[str, Any], ...]


def answer_json(result: ToolResult) -> Any:
    """A result as the JSON a tool message shows: its value, or ``{"error": {code, message}}``."""
    if result.error is None:
        return result.value
    return {"error": {"code": result.error.code, "message": result.error.message}}


def _json_text(value: Any) -> str:
    """A value as a tool message or table cell shows it: strings as they are, else JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)


def _status(result: ToolResult) -> str:
    return "success" if result.ok else "error"


def _canonical(result: ToolResult) -> str:
    # repr() for what JSON cannot hold (a set, a date): the pair is still compared.
    return json.dumps(answer_json(result), sort_keys=True, separators=(",", ":"), default=repr)


def agree(rehearsed: ToolResult, real: ToolResult) -> bool:
    """Whether the rehearsed answer is the real one: the same status and canonical JSON.

    This is the fidelity metrics' ``exact`` tier (``fidelity.metrics.compare``), restated
    because the foundation layer may not import ``fidelity``; tests pin the two together.
    """
    return rehearsed.ok == real.ok and _canonical(rehearsed) == _canonical(real)


def _words(text: str, drop_calls: bool = False, raws: Sequence[str] = ()) -> str:
    if drop_calls:
        for raw in filter(None, raws):  # a bare JSON call has no block around it
            text = text.replace(raw, "")
    return clean_text(text, drop_calls)


def _tool_call(index: int, record: CallRecord) -> dict[str, Any]:
    arguments = json.dumps(record.call.arguments, ensure_ascii=False, default=repr)
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": record.call.name, "arguments": arguments},
    }


def _answer(record: CallRecord) -> ToolResult | None:
    """The answer a trace shows for a call: the real one, else the one the agent saw."""
    return record.real if record.real is not None else record.seen()


def _tool_message(index: int, record: CallRecord) -> dict[str, Any]:
    answer = _answer(record)
    text = "(no answer: the episode ended)" if answer is None else _json_text(answer_json(answer))
    return {
        "role": "tool",
        "tool_call_id": f"call_{index}",
        "name": record.call.name,
        "content": text,
    }


def trace_messages(episode: Episode) -> list[dict[str, Any]]:
    """The episode as OpenAI-style chat messages, in the order the agent's context holds them.

    The prompt segment's text is the opening's last message (the task's first user message,
    or the agent's greeting when a simulated user speaks first); the system message and tool
    schemas are not stored with an episode. Each agent reply carries the calls it made
    (``CallRecord.step`` counts replies from 1), each answered by a ``tool`` message with the
    real answer (the shown one where the run had no real environment); the tool segments are
    left out, since those messages hold their content.
    """
    made: dict[int, list[tuple[int, CallRecord]]] = {}
    for index, record in enumerate(episode.calls):
        made.setdefault(record.step, []).append((index, record))
    greeting = any(s.role is Role.SIMULATED_USER for s in episode.segments)
    messages: list[dict[str, Any]] = []
    replies = 0
    for segment in episode.segments:
        if segment.role is Role.PROMPT:
            role = "assistant" if greeting else "user"
            messages.append({"role": role, "content": _words(segment.text)})
        elif segment.role in (Role.USER, Role.SIMULATED_USER):
            messages.append({"role": "user", "content": _words(segment.text)})
        elif segment.role is Role.ACT:
            replies += 1
            calls = made.get(replies, [])
            raws = [record.call.raw for _, record in calls]
            reply: dict[str, Any] = {
                "role": "assistant",
                "content": _words(segment.text, bool(calls), raws),
            }
            if calls:
                reply["tool_calls"] = [_tool_call(i, r) for i, r in calls]
            messages.append(reply)
            messages += [_tool_message(i, r) for i, r in calls]
    return messages


def call_span(index: int, record: CallRecord, rehearsed_text: str | None) -> dict[str, Any]:
    """One call as a ``tool`` span: its arguments in, the real answer out, the rehearsed
    answer (parsed, and the world role's text) and whether the two agree in ``metadata``.

    A call nobody rehearsed (a real-only run) has no rehearsed fields; a rehearsal that did not
    parse has its text only. ``shown`` names the answer the agent saw.
    """
    meta: dict[str, Any] = {"turn": record.turn, "agent_step": record.step, "shown": record.shown}
    if record.real is not None:
        meta["real"] = answer_json(record.real)
        meta["real_status"] = _status(record.real)
    if record.rehearsed is not None:
        meta["rehearsed"] = answer_json(record.rehearsed)
        meta["rehearsed_status"] = _status(record.rehearsed)
        if record.real is not None:
            meta["agree"] = agree(record.rehearsed, record.real)
    if rehearsed_text is not None:
        meta["rehearsed_text"] = _words(rehearsed_text)
    span: dict[str, Any] = {
        "id": f"call_{index}",
        "name": record.call.name,
        "kind": "tool",
        "input": record.call.arguments,
        "metadata": meta,
    }
    answer = _answer(record)
    if answer is not None:
        span["output"] = answer_json(answer)
        span["status"] = _status(answer)
        if answer.error is not None:
            span["error"] = f"{answer.error.code}: {answer.error.message}"
    return span


def episode_trace(episode: Episode, step: int) -> EpisodeTrace:
    """An episode as a trace: its messages, one span per call, and what the run knows of it
    (task, step, reward, how it ended, the test-time rehearsal budget and mode if any)."""
    texts = {r.call_index: r.completion.text for r in episode.rehearsals}
    spans = tuple(call_span(i, r, texts.get(i)) for i, r in enumerate(episode.calls))
    metadata: dict[str, Any] = {
        "episode_id": episode.id,
        "task_id": episode.task_id,
        "suite": episode.suite,
        "mode": str(episode.mode),
        "step": step,
        "reward": episode.reward,
        "stop_reason": str(episode.stop_reason),
    }
    if episode.stop_detail:
        metadata["stop_detail"] = episode.stop_detail
    for key in (MetaKey.BUDGET, MetaKey.REHEARSAL_MODE):
        if key in episode.meta:
            metadata[key] = episode.meta[key]
    pairs = [s["metadata"]["agree"] for s in spans if "agree" in s["metadata"]]
    if pairs:
        metadata["calls_agreeing"] = f"{sum(pairs)}/{len(pairs)}"
    return EpisodeTrace(tuple(trace_messages(episode)), metadata, spans)


def pick_evenly(items: Sequence[T], count: int) -> list[T]:
    """``count`` items spread evenly from the first on (all of them when there are fewer).

    A step's episodes come grouped by task (``group_size`` in a row), so evenly spaced picks
    fall on different tasks for as long as there are tasks to go round.
    """
    n = len(items)
    if count >= n:
        return list(items)
    return [items[k * n // count] for k in range(count)]


def call_rows(traces: Sequence[EpisodeTrace]) -> list[list[Any]]:
    """One row per call (``CALL_COLUMNS``) of ``traces``, answers as JSON text, for a table."""
    rows: list[list[Any]] = []
    for trace in traces:
        for span in trace.spans:
            meta = span["metadata"]
            rehearsed = meta.get("rehearsed", meta.get("rehearsed_text"))
            rows.append(
                [
                    trace.metadata["episode_id"],
                    meta["turn"],
                    span["name"],
                    _json_text(span["input"]),
                    None if rehearsed is None else _json_text(rehearsed),
                    _json_text(meta["real"]) if "real" in meta else None,
                    meta.get("agree"),
                ]
            )
    return rows


def tracker_note(config: Mapping[str, Any], run_id: str) -> str:
    """Where a run's tracker copy is, from its stored config (empty without ``report_to``)."""
    report_to = config.get("report_to", "none")
    if report_to not in ("trackio", "wandb"):
        return ""
    what = "Metrics" if config.get("trace_episodes") == 0 else "Traces and metrics"
    if report_to == "trackio":
        return (
            f"{what} also in trackio: project `{PROJECT}`, run `{run_id}` — "
            f"`trackio show --project {PROJECT}`"
        )
    return f"{what} also in Weights & Biases: project `{PROJECT}`, run `{run_id}`"


class Tracker(Protocol):
    """An experiment tracker's run: log scalars and traces at a step; finish once."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``."""
        ...

    def log_traces(self, traces: Sequence[EpisodeTrace], step: int) -> None:
        """Record ``traces`` at ``step``."""
        ...

    def finish(self) -> None:
        """Close the run."""
        ...


@dataclass(frozen=True)
class ModuleTracker:
    """trackio and wandb share this surface: ``module.log(dict, step=)``, ``module.finish()``;
    traces differ: trackio has ``Trace``, wandb gets a ``Table`` of calls."""

    module: Any

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Forward to the tracker module."""
        self.module.log(dict(metrics), step=step)

    def log_traces(self, traces: Sequence[EpisodeTrace], step: int) -> None:
        """Log the traces as trackio ``Trace`` objects, or (wandb) one table of their calls."""
        if not traces:
            return
        if self.module.__name__ == "wandb":
            table = self.module.Table(columns=list(CALL_COLUMNS), data=call_rows(traces))
            self.module.log({TABLE_KEY: table}, step=step)
            return
        logged = [
            self.module.Trace(messages=list(t.messages), metadata=t.metadata, spans=list(t.spans))
            for t in traces
        ]
        self.module.log({TRACE_KEY: logged}, step=step)

    def finish(self) -> None:
        """Forward to the tracker module."""
        self.module.finish()


def open_tracker(
    report_to: str, project: str, name: str, config: Mapping[str, Any]
) -> Tracker | None:
    """Start a tracker run (``None`` for ``report_to = "none"``)."""
    if report_to == "none":
        return None
    if report_to not in REPORT_TO:
        raise ValueError(f"report_to {report_to!r}: choose one of {', '.join(REPORT_TO)}")
    try:
        module = importlib.import_module(report_to)
    except ImportError as err:
        raise ValueError(
            f"report_to = {report_to!r} needs the {report_to} package: pip install {report_to}"
        ) from err
    module.init(project=project, name=name, config=dict(config))
    return ModuleTracker(module)


@dataclass(frozen=True)
class TrackingSink:
    """A ``Sink`` forwarding to ``inner`` that also logs every step's metrics to ``tracker``,
    and ``trace_episodes`` of every step's episodes as traces (0: none)."""

    inner: Sink
    tracker: Tracker
    trace_episodes: int = 0
    # Steps whose traces the tracker refused: the first one is logged as a warning.
    failed: list[int] = field(default_factory=list, compare=False, repr=False)

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Forward, and log a few of them as traces (a tracker error only warns, once)."""
        self.inner.episodes(step, episodes)
        picked = pick_evenly(episodes, self.trace_episodes)
        if not picked:
            return
        try:
            self.tracker.log_traces([episode_trace(e, step) for e in picked], step)
        except Exception as err:  # a trace is a view of the run: never worth the training job
            if not self.failed:
                LOG.warning(
                    "tracker: step %d's traces not logged (%r); metrics still are, and later "
                    "trace failures are not reported again",
                    step,
                    err,
                )
            self.failed.append(step)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Forward, and log to the tracker."""
        self.inner.metrics(step, metrics)
        self.tracker.log(metrics, step)

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Forward."""
        self.inner.progress(done, total, message)
