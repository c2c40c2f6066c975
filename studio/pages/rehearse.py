"""Live rehearse: pick a task state and a tool call, have a model rehearse it now, and compare
with the real response. Two ways in: a stored episode's call (compared also with the rehearsal
stored at training time), or a call you write on any task's initial state (run for real on a
fresh environment beside it).

The task state is the exact rehearse prompt the rollout built (its token ids are stored with
every rehearsal), so the live answer is comparable token for token with the stored one; the
model runs in the persistent worker subprocess (studio.rehearse_worker), loaded once.

The comparison means something only with the model that rehearsed during the run: the policy
checkpoint of the episode's step (a training run) or the run's model (an evaluation). Loading an
episode picks that model when this machine has it; otherwise (the demo bundle keeps no
checkpoints) the base model answers, and the page says so in a warning beside the model and
under every answer, naming the model that answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from envace_engine.environments import get_suite
from envace_engine.models import is_local_model
from studio import forms
from studio.context import Studio
from studio.pages.inspector import lookup, response_text
from studio.rehearse_worker import RehearseClient, RehearseError
from studio.space import LimitError

CALL_COLUMNS = [
    "call_index",
    "tool",
    "arguments_json",
    "rehearsed_status",
    "real_status",
    "fidelity",
]
BASE_MODEL = "smollm2-135m"  # what answers when the run's own model is not on this machine
MODELS = [BASE_MODEL, "tiny"]


@dataclass(frozen=True)
class RunModel:
    """The model that rehearsed a run's episode: ``wanted`` in words, ``own`` its name or path
    when this machine has it (else None)."""

    wanted: str
    own: str | None

    def default(self) -> str:
        """The model the page picks: the run's own, else the base model."""
        return self.own or BASE_MODEL


def _available(model: str, root: Path) -> str | None:
    """``model`` as the worker can load it (a built-in name, a checkpoint folder, a Hub id),
    or None when it is a folder this machine does not have."""
    if model in MODELS:
        return model
    for folder in (Path(model).expanduser(), root / model):
        if is_local_model(str(folder)):
            return str(folder)
    if is_local_model(model):  # BASE+ADAPTER_DIR
        return model
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    return model if looks_like_hub_id else None


def run_model(ctx: Studio, run_id: str, step: int) -> RunModel:
    """The model that rehearsed step ``step`` of run ``run_id``: a training run's policy at that
    step is its checkpoint ``step-<step>`` (its starting model at step 0); an evaluation or
    sweep ran its manifest's model."""
    info = ctx.store.run(run_id)
    model = info.manifest.model
    if info.manifest.kind == "train" and step > 0:
        folder = info.path / "checkpoints" / f"step-{step:06d}"
        own = str(folder) if is_local_model(str(folder)) else None
        return RunModel(f"checkpoint `step-{step:06d}` of run `{run_id}`", own)
    wanted = f"`{model}`, the model of run `{run_id}`" if model else f"the model of `{run_id}`"
    return RunModel(wanted, _available(model, ctx.root) if model else None)


def model_note(wanted: RunModel | None, chosen: str) -> str:
    """Which model answers, and a visible warning when it is not the one that rehearsed
    during the run (so its answer is not a re-run of that rehearsal)."""
    chosen = (chosen or "").strip()
    if wanted is None:
        return f"**Answers:** `{chosen}`."
    if chosen and chosen == wanted.own:
        return f"**Answers:** `{chosen}`: {wanted.wanted}, the model that rehearsed this call."
    missing = "" if wanted.own else ", which is not on this machine (no checkpoint kept)"
    return (
        f"⚠️ **Not the run's model.** `{chosen}` answers, but this call was rehearsed by "
        f"{wanted.wanted}{missing}: the live answer is another model's, not a re-run of the "
        "stored rehearsal."
    )


def rehearsable_calls(
    ctx: Studio, episode_id: str, run_id: str | None = None
) -> tuple[pd.DataFrame, str]:
    """The episode's calls that have a stored rehearse prompt, and a status line (the episode
    of ``run_id``; without a run the id must be in one run only: ids repeat across runs)."""
    calls, status, _, _ = load_episode(ctx, episode_id, run_id)
    return calls, status


def load_episode(
    ctx: Studio, episode_id: str, run_id: str | None = None
) -> tuple[pd.DataFrame, str, str, RunModel | None]:
    """(rehearsed calls, status line, its run, the model that rehearsed them) of one episode
    (the run is "" when none was found)."""
    episode_id = (episode_id or "").strip()
    empty = pd.DataFrame(columns=CALL_COLUMNS)
    if not episode_id:
        return empty, "Enter an episode id (rehearsal-mode runs).", "", None
    view, why = lookup(ctx, episode_id, (run_id or "").strip() or None, tab="rehearse")
    if view is None:
        return empty, why, "", None
    run = str(view.episode["run_id"])
    have = set(view.rehearsals["call_index"]) if not view.rehearsals.empty else set()
    calls = view.calls[view.calls["call_index"].isin(have)] if have else view.calls.iloc[0:0]
    wanted = run_model(ctx, run, int(view.episode["step"]))
    if calls.empty:
        none = f"Episode `{episode_id}` of run `{run}` has no rehearsed calls (a real-mode run?)."
        return empty, none, run, wanted
    status = f"{len(calls)} rehearsed call(s) of `{episode_id}` in run `{run}`: pick one."
    listed = calls.reindex(columns=CALL_COLUMNS)
    listed["fidelity"] = listed["fidelity"].astype(float).round(3)
    return listed, status, run, wanted


def model_picker(wanted: RunModel | None) -> tuple[Any, str]:
    """(model dropdown update, note) after an episode is loaded: the run's own model when this
    machine has it, else the base model with a warning."""
    if wanted is None:
        return gr.update(), ""
    chosen = wanted.default()
    choices = [*([wanted.own] if wanted.own and wanted.own not in MODELS else []), *MODELS]
    return gr.update(choices=choices, value=chosen), model_note(wanted, chosen)


def _prompt_ids(view: Any, call_index: int) -> list[int]:
    rows = view.rehearsals[view.rehearsals["call_index"] == call_index]
    if rows.empty:
        raise RehearseError(f"call {call_index} has no stored rehearse prompt")
    return [int(t) for t in rows.iloc[0]["prompt_ids"]]


def live_rehearse(
    ctx: Studio,
    client: RehearseClient,
    episode_id: str,
    call_index: float | None,
    model: str,
    temperature: float,
    run_id: str | None = None,
) -> tuple[str, str, str, str]:
    """(live answer, stored rehearsal, real response, timing line) for one call; the timing
    line names the model that answered and warns when it is not the one that rehearsed
    during the run."""
    if call_index is None:
        return "Pick a call first.", "", "", ""
    view, why = lookup(ctx, (episode_id or "").strip(), (run_id or "").strip() or None)
    if view is None:
        return why, "", "", ""
    try:
        ctx.limits.check_model(model)
        ids = _prompt_ids(view, int(call_index))
        answer = client.ask(
            {
                "model": model,
                "prompt_ids": ids,
                "max_new_tokens": 160,
                "temperature": float(temperature),
                "seed": 0,
            }
        )
    except (LimitError, RehearseError) as err:
        return f"**Cannot rehearse:** {err}", "", "", ""
    call = view.calls[view.calls["call_index"] == int(call_index)].iloc[0].to_dict()
    wanted = run_model(ctx, str(view.episode["run_id"]), int(view.episode["step"]))
    timing = (
        f"{answer['tokens']} tokens in {answer['seconds']:.2f} s"
        + (f" (model loaded in {answer['load_s']:.1f} s)" if answer["load_s"] else "")
        + f" · {len(ids)} prompt tokens · finish: {answer['finish_reason']}\n\n"
        + model_note(wanted, str(answer.get("model") or model))
    )
    return (
        _live_text(answer),
        response_text(call, "rehearsed") or "(none)",
        response_text(call, "real") or "(no real response recorded)",
        timing,
    )


def parse_call(text: str) -> dict[str, Any]:
    """The user's tool call as ``{"name", "arguments"}``; ValueError says what to fix."""
    try:
        call = json.loads(text or "")
    except json.JSONDecodeError as err:
        raise ValueError(f"the tool call is not JSON ({err.msg} at char {err.pos})") from err
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError('write the call as {"name": "tool_name", "arguments": {...}}')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ValueError('"arguments" must be a JSON object')
    return {"name": call["name"], "arguments": arguments}


def task_state(suite: str, split: str, task_id: str) -> str:
    """The task's first user turn, tools and initial state, for the user to write a call."""

    try:
        tasks = {t.id: t for t in get_suite(suite).tasks(split)}
    except ValueError as err:
        return f"**{err}**"
    task = tasks.get((task_id or "").strip())
    if task is None:
        some = ", ".join(f"`{t}`" for t in list(tasks)[:5])
        return f"**No task `{task_id}` in {suite}/{split}.** Try one of {some}, …"
    tools = ", ".join(f"`{t['function']['name']}`" for t in task.tools) or "(see environment)"
    state = json.dumps(task.initial_state, indent=1)[:3000]
    return f"**{task.user_turns[0]}**\n\ntools: {tools}\n\n```json\n{state}\n```"


def rehearse_new_call(
    ctx: Studio,
    client: RehearseClient,
    suite: str,
    split: str,
    task_id: str,
    call_text: str,
    model: str,
    temperature: float,
) -> tuple[str, str, str]:
    """(live answer, real response, timing line) for a call the user wrote."""
    try:
        ctx.limits.check_model(model)
        call = parse_call(call_text)
        answer = client.ask(
            {
                "kind": "call",
                "model": model,
                "suite": suite,
                "split": split,
                "task_id": (task_id or "").strip(),
                "call": call,
                "max_new_tokens": 160,
                "temperature": float(temperature),
                "seed": 0,
            }
        )
    except (ValueError, RehearseError, LimitError) as err:
        return f"**Cannot rehearse:** {err}", "", ""
    real = f"```json\n{json.dumps(answer['real'], indent=2)}\n```"
    timing = (
        f"{answer['tokens']} tokens in {answer['seconds']:.2f} s"
        f" · {answer['prompt_tokens']} prompt tokens · answered by "
        f"`{answer.get('model') or model}`"
    )
    return _live_text(answer), real, timing


def _live_text(answer: dict[str, Any]) -> str:
    if answer.get("result_error"):
        parsed = f"error {answer['result_error']}"
    elif answer.get("error"):
        parsed = f"unparseable ({answer['error']})"
    else:
        parsed = f"```json\n{json.dumps(answer['result'], indent=2)}\n```"
    raw = f"<details><summary>raw output</summary>\n\n```\n{answer['text']}\n```\n</details>"
    return f"{parsed}\n\n{raw}"


def open_calls(ctx: Studio, episode_id: str, run_id: str | None) -> tuple[Any, ...]:
    """(calls, status, run, model dropdown, model note, the run's model) for the page's
    episode: the run found is written back, so the later requests name it."""
    calls, status, run, wanted = load_episode(ctx, episode_id, run_id)
    return (calls, status, run or run_id or "", *model_picker(wanted), wanted)


def build(ctx: Studio, tab: gr.Tab | None = None) -> None:
    """Lay out the page and wire its events (``?tab=rehearse&run=RUN&episode=ID`` fills it
    in)."""
    client = RehearseClient()
    gr.Markdown(
        "Pick an episode of a rehearsal-mode run and one of its tool calls: the model "
        "rehearses the call from the same prompt the rollout used. The first request "
        "loads the model (a few seconds); later ones reuse it. The run's own model (the "
        "checkpoint of the episode's step) answers when this machine has it; otherwise the "
        "page says which model answers instead."
    )
    with gr.Row():
        episode = gr.Textbox(label="episode id", elem_id="reh-episode", scale=3)
        run = gr.Textbox(label="run (when the id is in several)", elem_id="reh-run", scale=2)
        load = gr.Button("Load calls", scale=1, elem_id="reh-load")
    status = gr.Markdown(elem_id="reh-status")
    calls = gr.Dataframe(pd.DataFrame(columns=CALL_COLUMNS), interactive=False, max_height=220)
    with gr.Row():
        index = gr.Number(None, label="call index", precision=0, elem_id="reh-index")
        model = gr.Dropdown(
            MODELS,
            value=BASE_MODEL,
            allow_custom_value=True,
            label="model (embedded or checkpoint folder)",
            elem_id="reh-model",
        )
        temperature = gr.Slider(0, 1.5, 0, step=0.1, label="temperature (0 = greedy)")
        go = gr.Button("Rehearse now", variant="primary", elem_id="reh-go")
    note = gr.Markdown(elem_id="reh-model-note")
    wanted = gr.State(None)  # the loaded episode's RunModel: the note follows the dropdown
    timing = gr.Markdown(elem_id="reh-timing")
    with gr.Row():
        with gr.Column():
            gr.Markdown("#### Rehearsed now")
            live = gr.Markdown(elem_id="reh-live", container=True)
        with gr.Column():
            gr.Markdown("#### Rehearsed during the run")
            stored = gr.Markdown(container=True)
        with gr.Column():
            gr.Markdown("#### Real response")
            real = gr.Markdown(container=True)
    loaded = [calls, status, run, model, note, wanted]
    load.click(lambda e, r: open_calls(ctx, e, r), [episode, run], loaded)
    episode.submit(lambda e, r: open_calls(ctx, e, r), [episode, run], loaded)
    model.input(lambda w, m: model_note(w, m) if w else "", [wanted, model], [note])

    def pick(evt: gr.SelectData, df: pd.DataFrame) -> int:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return int(df.iloc[row]["call_index"])

    calls.select(pick, [calls], [index])

    def from_link(current: str, request: gr.Request) -> tuple[object, ...]:
        params = request.query_params if request else {}
        linked, run_id = params.get("episode", ""), params.get("run", "")
        if current or not linked:  # already filled, or no deep link
            return tuple(gr.update() for _ in range(7))
        return (linked, *open_calls(ctx, linked, run_id))

    if tab is not None:
        tab.select(from_link, [episode], [episode, *loaded])
    go.click(
        lambda e, i, m, t, r: live_rehearse(ctx, client, e, i, m, t, r),
        [episode, index, model, temperature, run],
        [live, stored, real, timing],
    )
    _build_new_call(ctx, client, model, temperature)


def _build_new_call(
    ctx: Studio, client: RehearseClient, model: gr.Dropdown, temperature: gr.Slider
) -> None:
    """Second section: write a call on any task's initial state."""
    gr.Markdown(
        "### Rehearse a call you write\nPick a task (its initial state is shown), write a tool "
        "call, and compare the model's rehearsal with the real tool run on a fresh environment."
    )
    with gr.Row():
        suite = gr.Dropdown(list(forms.SUITES), value="toy", label="suite")
        split = gr.Textbox("validation", label="split (bfcl: test or a category)")
        task_id = gr.Textbox("toy/s2-0", label="task id", elem_id="reh-task")
        show = gr.Button("Show task", elem_id="reh-show")
    state = gr.Markdown(elem_id="reh-state", container=True)
    call = gr.Textbox(
        '{"name": "", "arguments": {}}', label="tool call (JSON)", lines=2, elem_id="reh-call"
    )
    go = gr.Button("Rehearse this call", variant="primary", elem_id="reh-go-new")
    timing = gr.Markdown(elem_id="reh-new-timing")
    with gr.Row():
        with gr.Column():
            gr.Markdown("#### Rehearsed now")
            live = gr.Markdown(elem_id="reh-new-live", container=True)
        with gr.Column():
            gr.Markdown("#### Real response (fresh environment)")
            real = gr.Markdown(elem_id="reh-new-real", container=True)
    show.click(task_state, [suite, split, task_id], [state])
    go.click(
        lambda *args: rehearse_new_call(ctx, client, *args),
        [suite, split, task_id, call, model, temperature],
        [live, real, timing],
    )
