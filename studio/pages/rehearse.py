"""Live rehearse: pick a task state (a stored episode, just before one of its tool calls) and
the call, have a model rehearse it now, and compare with the real response and the rehearsal
stored at training time.

The task state is the exact rehearse prompt the rollout built (its token ids are stored with
every rehearsal), so the live answer is comparable token for token with the stored one; the
model runs in the persistent worker subprocess (studio.rehearse_worker), loaded once.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from studio.context import Studio
from studio.pages.inspector import response_text
from studio.rehearse_worker import RehearseClient, RehearseError

CALL_COLUMNS = [
    "call_index",
    "tool",
    "arguments_json",
    "rehearsed_status",
    "real_status",
    "fidelity",
]


def rehearsable_calls(ctx: Studio, episode_id: str) -> tuple[pd.DataFrame, str]:
    """The episode's calls that have a stored rehearse prompt, and a status line."""
    episode_id = (episode_id or "").strip()
    if not episode_id:
        return pd.DataFrame(columns=CALL_COLUMNS), "Enter an episode id (rehearsal-mode runs)."
    try:
        view = ctx.store.episode(episode_id)
    except KeyError:
        return pd.DataFrame(columns=CALL_COLUMNS), f"**No episode `{episode_id}`** in storage."
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
) -> tuple[str, str, str, str]:
    """(live answer, stored rehearsal, real response, timing line) for one call."""
    if call_index is None:
        return "Pick a call first.", "", "", ""
    try:
        view = ctx.store.episode((episode_id or "").strip())
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
    except RehearseError as err:
        return f"**Cannot rehearse:** {err}", "", "", ""
    call = view.calls[view.calls["call_index"] == int(call_index)].iloc[0].to_dict()
    if answer.get("result_error"):
        parsed = f"error {answer['result_error']}"
    elif answer.get("error"):
        parsed = f"unparseable ({answer['error']})"
    else:
        parsed = f"```json\n{json.dumps(answer['result'], indent=2)}\n```"
    raw = f"<details><summary>raw output</summary>\n\n```\n{answer['text']}\n```\n</details>"
    live = f"{parsed}\n\n{raw}"
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


def build(ctx: Studio) -> None:
    """Lay out the page and wire its events."""
    client = RehearseClient()
    gr.Markdown(
        "Pick an episode of a rehearsal-mode run and one of its tool calls: the model "
        "rehearses the call from the same prompt the rollout used. The first request "
        "loads the model (a few seconds); later ones reuse it."
    )
    with gr.Row():
        episode = gr.Textbox(label="episode id", elem_id="reh-episode", scale=3)
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
    load.click(lambda e: rehearsable_calls(ctx, e), [episode], [calls, status])
    episode.submit(lambda e: rehearsable_calls(ctx, e), [episode], [calls, status])

    def pick(evt: gr.SelectData, df: pd.DataFrame) -> int:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return int(df.iloc[row]["call_index"])

    calls.select(pick, [calls], [index])
    go.click(
        lambda e, i, m, t: live_rehearse(ctx, client, e, i, m, t),
        [episode, index, model, temperature],
        [live, stored, real, timing],
    )
