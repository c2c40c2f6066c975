"""Live rehearse: pick a task state and a tool call, have a model rehearse it now, and compare
with the real response. Two ways in: a stored episode's call (compared also with the rehearsal
stored at training time), or a call you write on any task's initial state (run for real on a
fresh environment beside it).

The task state is the exact rehearse prompt the rollout built (its token ids are stored with
every rehearsal), so the live answer is comparable token for token with the stored one; the
model runs in the persistent worker subprocess (studio.rehearse_worker), loaded once.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from studio import forms
from studio.context import Studio
from studio.pages.inspector import response_text
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


def rehearsable_calls(
    ctx: Studio, episode_id: str, run_id: str | None = None
) -> tuple[pd.DataFrame, str]:
    """The episode's calls that have a stored rehearse prompt, and a status line (the episode
    of ``run_id`` when given: ids repeat across runs)."""
    episode_id = (episode_id or "").strip()
    if not episode_id:
        return pd.DataFrame(columns=CALL_COLUMNS), "Enter an episode id (rehearsal-mode runs)."
    run_id = (run_id or "").strip() or None
    try:
        view = ctx.store.episode(episode_id, run_id)
    except KeyError:
        where = f" in run `{run_id}`" if run_id else ""
        return pd.DataFrame(columns=CALL_COLUMNS), f"**No episode `{episode_id}`**{where}."
    have = set(view.rehearsals["call_index"]) if not view.rehearsals.empty else set()
    calls = view.calls[view.calls["call_index"].isin(have)] if have else view.calls.iloc[0:0]
    if calls.empty:
        return (
            pd.DataFrame(columns=CALL_COLUMNS),
            f"Episode `{episode_id}` has no rehearsed calls (was it a real-mode run?).",
        )
    return calls.reindex(columns=CALL_COLUMNS), f"{len(calls)} rehearsed call(s): pick one."


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
    """(live answer, stored rehearsal, real response, timing line) for one call."""
    if call_index is None:
        return "Pick a call first.", "", "", ""
    try:
        ctx.limits.check_model(model)
        view = ctx.store.episode((episode_id or "").strip(), (run_id or "").strip() or None)
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
    except KeyError:
        return f"No episode `{episode_id}`.", "", "", ""
    except (LimitError, RehearseError) as err:
        return f"**Cannot rehearse:** {err}", "", "", ""
    call = view.calls[view.calls["call_index"] == int(call_index)].iloc[0].to_dict()
    live = _live_text(answer)
    timing = (
        f"{answer['tokens']} tokens in {answer['seconds']:.2f} s"
        + (f" (model loaded in {answer['load_s']:.1f} s)" if answer["load_s"] else "")
        + f" · {len(ids)} prompt tokens · finish: {answer['finish_reason']}"
    )
    return (
        live,
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
    from envace_engine.environments import get_suite

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
        f" · {answer['prompt_tokens']} prompt tokens"
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


def build(ctx: Studio, tab: gr.Tab | None = None) -> None:
    """Lay out the page and wire its events (``?tab=rehearse&run=RUN&episode=ID`` fills it
    in)."""
    client = RehearseClient()
    gr.Markdown(
        "Pick an episode of a rehearsal-mode run and one of its tool calls: the model "
        "rehearses the call from the same prompt the rollout used. The first request "
        "loads the model (a few seconds); later ones reuse it."
    )
    with gr.Row():
        episode = gr.Textbox(label="episode id", elem_id="reh-episode", scale=3)
        run = gr.Textbox(label="run (when the id is in several)", elem_id="reh-run", scale=2)
        load = gr.Button("Load calls", scale=1, elem_id="reh-load")
    status = gr.Markdown()
    calls = gr.Dataframe(pd.DataFrame(columns=CALL_COLUMNS), interactive=False, max_height=220)
    with gr.Row():
        index = gr.Number(None, label="call index", precision=0, elem_id="reh-index")
        model = gr.Dropdown(
            ["smollm2-135m", "tiny"],
            value="smollm2-135m",
            allow_custom_value=True,
            label="model (embedded or checkpoint folder)",
            elem_id="reh-model",
        )
        temperature = gr.Slider(0, 1.5, 0, step=0.1, label="temperature (0 = greedy)")
        go = gr.Button("Rehearse now", variant="primary", elem_id="reh-go")
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
    load.click(lambda e, r: rehearsable_calls(ctx, e, r), [episode, run], [calls, status])
    episode.submit(lambda e, r: rehearsable_calls(ctx, e, r), [episode, run], [calls, status])

    def pick(evt: gr.SelectData, df: pd.DataFrame) -> int:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return int(df.iloc[row]["call_index"])

    calls.select(pick, [calls], [index])

    def from_link(current: str, request: gr.Request) -> tuple[object, ...]:
        params = request.query_params if request else {}
        wanted, run_id = params.get("episode", ""), params.get("run", "")
        if current or not wanted:  # already filled, or no deep link
            return gr.update(), gr.update(), gr.update(), gr.update()
        return (wanted, run_id, *rehearsable_calls(ctx, wanted, run_id))

    if tab is not None:
        tab.select(from_link, [episode], [episode, run, calls, status])
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
