"""Trajectory inspector: pick run / step / task / episode and read it turn by turn.

The chat view nests every tool call's answers under it: the rehearsed response (what the policy
imagined the tool returned) and, beside it, the real response (what the shadow environment
returned), titled with their fidelity. The token view colours the agent context and every
rehearsal sequence by role: act and rehearse tokens are trained, the rest are not.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import gradio as gr
import pandas as pd

from storage.search import ROLES as SEARCH_ROLES
from studio.context import Studio
from studio.pages.runs import run_choices

PAGE_SIZE = 50
LIST_COLUMNS = [
    "episode_id",
    "step",
    "task_id",
    "mode",
    "reward",
    "stop_reason",
    "n_calls",
    "mean_fidelity",
]
TOKEN_COLOURS = {
    "act (trained)": "#4caf50",
    "rehearse (trained)": "#ff9800",
    "act (sampled, not trained)": "#c8e6c9",
    "rehearse (sampled, not trained)": "#ffe0b2",
    "not trained": "#d0d0d0",
}


SEARCH_COLUMNS = ["episode_id", "step", "task_id", "reward", "stop_reason", "role", "snippet"]
SEARCH_LIMIT = 100


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _pretty(text: str | None) -> str:
    """Indented JSON when ``text`` is JSON, else the text itself."""
    if text is None or not _present(text):
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return str(text)


def response_text(call: dict[str, Any], source: str) -> str | None:
    """One answer of a call (``rehearsed``/``real``/``simulated``/``checked``) as display text,
    or None."""
    status = call.get(f"{source}_status")  # only rehearsed and real answers have a column
    error = call.get(f"{source}_error")
    if _present(error):
        message = call.get(f"{source}_message")
        return f"error {error}: {message}" if _present(message) else f"error {error}"
    value = call.get(f"{source}_json")
    if _present(value):
        return f"```json\n{_pretty(value)}\n```"
    return "(no value)" if _present(status) else None


def _call_blocks(call: dict[str, Any], index: int, raw: str | None) -> list[dict[str, Any]]:
    """A tool-call block with its rehearsed and real answers nested under it.

    ``raw`` is the world role's own output for this call: shown when it did not parse, so an
    unparseable rehearsal is visible instead of silently missing.
    """
    call_id = f"call-{index}"
    args = _pretty(call.get("arguments_json")) or "{}"
    fidelity = call.get("fidelity")
    score = f" — fidelity {fidelity:.2f}" if _present(fidelity) else ""
    # No "status": gradio opens such blocks, so the rehearsed/real pair is visible at once.
    blocks = [
        {
            "role": "assistant",
            "content": f"```json\n{args}\n```",
            "metadata": {
                "title": f"tool call {index}: {call.get('tool')}",
                "log": f"agent saw the {call.get('shown')} response{score}",
                "id": call_id,
            },
        }
    ]
    for source in ("rehearsed", "checked", "real", "simulated"):
        text = response_text(call, source)
        if text is None and source == "rehearsed" and raw is not None:
            text, source = f"```\n{raw}\n```", "rehearsed"
            title = "rehearsed response (unparseable)"
        elif source == "checked":  # RolloutConfig.check_calls refused it: no world generation
            title = "schema check (the world role was not asked)"
        else:
            title = f"{source} response"
        if text is not None:
            blocks.append(
                {
                    "role": "assistant",
                    "content": text,
                    "metadata": {"title": title, "parent_id": call_id},
                }
            )
    return blocks


def chat_messages(view: Any) -> list[dict[str, Any]]:
    """The episode as chat messages: prompt, user turns, agent replies, nested tool calls.

    Tool calls are attached after the agent reply that made them: the rollout records
    ``agent_step`` as the number of agent replies so far, so the k-th reply (0-based) made the
    calls with ``agent_step == k + 1``. Tool/real segments are left out when the call blocks
    already show their content.
    """
    segments = view.segments.to_dict("records")
    calls = view.calls.to_dict("records")
    raw = {int(r["call_index"]): r["text"] for r in view.rehearsals.to_dict("records")}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        by_step.setdefault(int(call["agent_step"]), []).append(call)
    messages: list[dict[str, Any]] = []
    act_index = 0
    for seg in segments:
        role, text = seg["role"], seg["text"]
        if role == "prompt":
            messages.append(
                {
                    "role": "user",
                    "content": text,
                    "metadata": {
                        "title": "task prompt (system, tools, first user turn)",
                        "status": "done",
                    },
                }
            )
        elif role == "user":
            messages.append({"role": "user", "content": text})
        elif role == "simulated_user":  # written by a user simulator (tau2), not the task
            messages.append(
                {"role": "user", "content": text, "metadata": {"title": "simulated user"}}
            )
        elif role == "act":
            messages.append({"role": "assistant", "content": text})
            act_index += 1
            for call in by_step.get(act_index, []):
                index = int(call["call_index"])
                messages += _call_blocks(call, index, raw.get(index))
        elif not calls:  # tool messages of an episode without call records
            messages.append(
                {
                    "role": "assistant",
                    "content": text,
                    "metadata": {"title": f"tool ({role})", "status": "done"},
                }
            )
    return messages


def token_view(view: Any) -> list[tuple[str, str | None]]:
    """(text, colour label) chunks: the agent context, then each rehearsal sequence.

    A role's sampled tokens are "trained" when the episode has an advantage for that role
    (a training step used them); evaluations, and roles a mode freezes (the world role of
    ``act-only`` and ``real-grpo``), show them as sampled, not trained.
    """
    trained = set(view.advantages or {})
    label = {
        role: f"{role} (trained)" if role in trained else f"{role} (sampled, not trained)"
        for role in ("act", "rehearse")
    }
    chunks: list[tuple[str, str | None]] = [
        (seg["text"], label.get(seg["role"], "not trained"))
        for seg in view.segments.to_dict("records")
    ]
    for reh in view.rehearsals.to_dict("records"):
        chunks.append(
            (
                f"\n\n── rehearsal of call {reh['call_index']} "
                f"({reh['n_prompt_tokens']} prompt tokens, not trained) ──\n",
                None,
            )
        )
        chunks.append((reh["text"], label["rehearse"]))
    return chunks


def summary(view: Any) -> str:
    """Reward, stop reason, advantages per role and token counts, as Markdown."""
    ep = view.episode

    def num(key: str) -> str:
        value = ep.get(key)
        return f"{value:+.3f}" if _present(value) else "—"

    reward = ep.get("reward")
    return (
        f"**{ep['episode_id']}** · run `{ep['run_id']}` · step {ep['step']} · task "
        f"`{ep['task_id']}` ({ep['suite']}, {ep['mode']} mode)\n\n"
        f"| reward | stop reason | advantage act | advantage rehearse | act tokens | "
        f"rehearse tokens | drift |\n|---|---|---|---|---|---|---|\n"
        f"| {f'{reward:.3f}' if _present(reward) else 'unscored'} | {ep['stop_reason']}"
        f"{': ' + ep['stop_detail'] if ep.get('stop_detail') else ''} | {num('adv_act')} | "
        f"{num('adv_rehearse')} | {ep.get('n_act_tokens', 0)} | {ep.get('n_rehearse_tokens', 0)}"
        f" | {ep.get('drift', 0)} |"
    )


def episode_list(
    ctx: Studio, run_id: str | None, step: str, task: str, stop_reason: str | None, page: float = 1
) -> tuple[pd.DataFrame, str]:
    """One page of episodes matching the filters (never the whole table), and a pager line."""
    step = (step or "").strip()
    if step and not step.isdigit():
        return (
            pd.DataFrame(columns=LIST_COLUMNS),
            f"**step** must be a whole number or empty for all steps (got {step!r})",
        )
    filters = {
        "run_id": run_id or None,
        "step": int(step) if step else None,
        "task": (task or "").strip() or None,
        "stop_reason": stop_reason or None,
    }
    page = max(1, int(page or 1))
    df = ctx.store.episodes(limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE, **filters)
    total = ctx.store.count_episodes(**filters)
    pages = max(1, -(-total // PAGE_SIZE))
    return df.reindex(columns=LIST_COLUMNS), f"{total} episode(s) · page {page} of {pages}"


def open_episode(
    ctx: Studio, episode_id: str, run_id: str | None = None
) -> tuple[list[dict[str, Any]], str, list, str]:
    """(chat messages, summary, token chunks, status line) for one episode id (of ``run_id``
    when given: ids repeat across runs)."""
    episode_id = (episode_id or "").strip()
    if not episode_id:
        return [], "Pick an episode from the list or paste its id.", [], ""
    try:
        view = ctx.store.episode(episode_id, run_id)
    except KeyError:
        return (
            [],
            f"**No episode `{episode_id}`** in storage: check the id or pick from the list.",
            [],
            "",
        )
    run_id = run_id or str(view.episode["run_id"])
    here = f"run={run_id}&episode={episode_id}"
    link = (
        f"Deep link: `?tab=inspector&{here}` · [live rehearse its calls](?tab=rehearse&{here})"
        f" · [label it](?tab=annotate&{here})"
    )
    return chat_messages(view), summary(view), token_view(view), link


def next_failure(ctx: Studio, run_id: str | None, episode_id: str) -> str:
    """The id of the next failed episode after ``episode_id`` (or the first), else unchanged."""
    if not run_id:
        return episode_id
    found = ctx.store.next_failure(run_id, episode_id or None)
    return found or episode_id


def search(
    ctx: Studio,
    run_id: str | None,
    text: str,
    roles: list[str],
    stop: str,
    mismatch: bool,
    tool: str,
) -> tuple[Any, str]:
    """(results table, message) of a text search in the run with the page's filters."""
    from storage.search import SearchQuery, snippet

    try:
        if not run_id:
            raise ValueError("pick a run first")
        q = SearchQuery(
            run_id,
            text or "",
            roles=tuple(roles or ()),
            stop_reason=stop or None,
            status_mismatch=bool(mismatch),
            tool=(tool or "").strip() or None,
            limit=SEARCH_LIMIT,
        )
    except ValueError as err:
        return gr.update(visible=False), f"**Search:** {err}"
    hits = ctx.store.search(q)
    if hits.empty:
        return gr.update(visible=False), f"No match for “{q.text}” with these filters."
    hits["snippet"] = [snippet(t, q.text) for t in hits["text"]]
    table = hits.reindex(columns=SEARCH_COLUMNS)
    more = " (the first ones: narrow the filters)" if len(hits) == SEARCH_LIMIT else ""
    message = f"{len(hits)} match(es){more}; click one to open its episode."
    return gr.update(value=table, visible=True), message


def build(ctx: Studio, tab: gr.Tab, demo: gr.Blocks) -> None:
    """Lay out the page and wire its events (read-only: no user needed).

    A deep link (``?tab=inspector&run=&episode=``) fills the page with the page load, beside the
    browser's switch to the tab (one round trip, not two in a row); otherwise nothing is
    queried until the tab is opened, and then the newest run fills the page.
    """
    with gr.Row():
        # value=None: an empty picker tells the tab handler the page has not been filled yet
        run = gr.Dropdown(
            run_choices(ctx), value=None, label="run", allow_custom_value=True, elem_id="insp-run"
        )
        step = gr.Textbox(label="step (empty = all)")
        task = gr.Textbox(label="task id")
        stop = gr.Dropdown(
            [
                "",
                "done",
                "malformed_call",
                "invalid_rehearsal",
                "unparseable_rehearsal",
                "context_limit",
                "turn_limit",
                "token_limit",
                "truncated",
                "sampler_error",
            ],
            value="",
            label="stop reason",
        )
        page = gr.Number(1, label="page", precision=0, minimum=1)
    with gr.Accordion("Search this run", open=True, elem_id="insp-search-box"), gr.Row():
        query = gr.Textbox(label="text", placeholder="a phrase", elem_id="insp-search", scale=3)
        roles = gr.CheckboxGroup(list(SEARCH_ROLES), value=list(SEARCH_ROLES), label="in")
        mismatch = gr.Checkbox(False, label="status mismatch", elem_id="insp-mismatch")
        tool = gr.Textbox(label="tool", elem_id="insp-tool")
        go = gr.Button("Search", elem_id="insp-search-go", scale=1)
    found = gr.Dataframe(
        pd.DataFrame(columns=SEARCH_COLUMNS),
        interactive=False,
        max_height=240,
        datatype=["str", "number", "str", "number", "str", "str", "html"],
        elem_id="insp-search-results",
        visible=False,
    )
    searched = gr.Markdown(elem_id="insp-search-message")
    pager = gr.Markdown(elem_id="insp-pager")
    table = gr.Dataframe(
        pd.DataFrame(columns=LIST_COLUMNS),
        interactive=False,
        max_height=240,
        elem_id="episode-list",
    )
    with gr.Row():
        episode = gr.Textbox(label="episode id", elem_id="insp-episode", scale=4)
        show = gr.Button("Open", scale=1, elem_id="insp-open")
        fail = gr.Button("Next failure", scale=1, elem_id="insp-next-failure")
    head = gr.Markdown(elem_id="insp-summary")
    link = gr.Markdown(elem_id="insp-link")
    with gr.Row():
        chat = gr.Chatbot(
            label="turn by turn", height=620, elem_id="insp-chat", scale=3, autoscroll=False
        )
        tokens = gr.HighlightedText(
            label="token roles",
            color_map=TOKEN_COLOURS,
            elem_id="insp-tokens",
            scale=2,
            show_legend=True,
        )
    filters = [run, step, task, stop, page]
    for control in filters:
        # gradio adds the event methods at runtime; its types do not declare them on the
        # FormComponent base that mypy joins these components to.
        # .input: a user's edit (a deep link's own update of the run must not list twice)
        control.input(lambda *v: episode_list(ctx, *v), filters, [table, pager])  # type: ignore[attr-defined]
    outputs = [chat, head, tokens, link]
    show.click(lambda e: open_episode(ctx, e), [episode], outputs)
    episode.submit(lambda e: open_episode(ctx, e), [episode], outputs)

    def pick(evt: gr.SelectData, df: pd.DataFrame, run_id: str | None) -> tuple[object, ...]:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        episode_id = str(df.iloc[row]["episode_id"])
        return (episode_id, *open_episode(ctx, episode_id, run_id))  # the listed run's

    table.select(pick, [table, run], [episode, *outputs])
    found.select(pick, [found, run], [episode, *outputs])
    ask = [run, query, roles, stop, mismatch, tool]
    go.click(lambda *v: search(ctx, *v), ask, [found, searched])
    query.submit(lambda *v: search(ctx, *v), ask, [found, searched])

    def jump(run_id: str | None, current: str) -> tuple[object, ...]:
        episode_id = next_failure(ctx, run_id, current)
        return (episode_id, *open_episode(ctx, episode_id))

    fail.click(jump, [run, episode], [episode, *outputs])

    keep = tuple(gr.update() for _ in range(4 + len(outputs)))

    def deep_link(current_run: str | None, request: gr.Request) -> tuple[object, ...]:
        if current_run:  # already filled: reopening the tab keeps what the user picked
            return keep
        episode_id = request.query_params.get("episode", "") if request else ""
        run_id = request.query_params.get("run") if request else None
        if episode_id and not run_id:  # ids repeat across runs: &run= says which
            with contextlib.suppress(KeyError):  # an unknown id is reported by open_episode
                run_id = ctx.store.episode(episode_id).episode["run_id"]
        choices = run_choices(ctx)  # runs may have appeared since the app was built
        run_id = run_id or next(iter(choices), None)
        listing = episode_list(ctx, run_id, "", "", "", 1)
        picker = gr.update(choices=choices, value=run_id)
        return (episode_id, picker, *listing, *open_episode(ctx, episode_id, run_id))

    def on_open(current_run: str | None, request: gr.Request) -> tuple[object, ...]:
        if request and request.query_params.get("tab") == "inspector":
            return keep  # the page load's handler fills it
        return deep_link(current_run, request)

    def on_load(request: gr.Request) -> tuple[object, ...]:
        if not request or request.query_params.get("tab") != "inspector":
            return keep
        return deep_link(None, request)

    targets = [episode, run, table, pager, *outputs]
    tab.select(on_open, [run], targets)
    demo.load(on_load, None, targets)
