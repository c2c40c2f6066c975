"""The annotation queue (top of the Annotate page): one rehearsed-vs-real pair at a time.

Pick a run and filters (tool, rehearsed and real status, fidelity range, scope: unlabelled by
me, labelled by others, all); the page shows the pair with its context — the agent's chat up to
the call, the call, both responses side by side with the differences marked — and labels it
with keys 1–5 (each shown beside its label); **Enter** saves and moves on (clearing the note),
**Alt+←** goes back (script in ``studio.app.HEAD``). Every view is of one run's pair: call ids
repeat across runs, so the header, context, diff and label all use the queue's run.
Progress counts the filtered pairs labelled by you. With two or more authors on the same pairs
the agreement table shows, per pair of authors, Cohen's kappa, observed and per-label agreement.
Every view has a deep link: ``?tab=annotate&run=RUN&call=CALL_ID``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr
import pandas as pd

from storage.queue import SCOPES, QueueFilter
from studio.context import Studio
from studio.lazy import PageLoads
from studio.pages import compare, inspector
from studio.pages.annotate import NOTE_INFO, label_choices, label_title

ANY = "any"
AGREEMENT_COLUMNS = ["authors", "items", "kappa", "observed", "per label"]


def pair_runs(ctx: Studio) -> list[str]:
    """Runs with scored pairs (the only ones a queue can hold), newest first."""
    df = ctx.store.fidelity_by_run()
    return [] if df.empty else sorted(df["run_id"], reverse=True)


def queue_filter(
    run_id: str,
    author: str,
    scope: str,
    tool: str | None,
    rehearsed: str | None,
    real: str | None,
    fid_min: float | None,
    fid_max: float | None,
) -> QueueFilter:
    """The form's values as a ``QueueFilter`` (``any`` and empty mean no filter)."""

    def pick(value: str | None) -> str | None:
        return None if value in (None, "", ANY) else value

    return QueueFilter(
        run_id=run_id,
        author=author,
        tool=pick(tool),
        rehearsed_status=pick(rehearsed),
        real_status=pick(real),
        fidelity_min=fid_min if fid_min else None,
        fidelity_max=fid_max if fid_max is not None and fid_max < 1 else None,
        scope=scope if scope in SCOPES else "unlabelled",  # type: ignore[arg-type]
    )


def context_messages(ctx: Studio, call_id: str, run_id: str) -> list[dict[str, Any]]:
    """The chat of the run's episode up to and including the call (its answers are in the
    diff)."""
    view, _ = inspector.lookup(ctx, call_id.rpartition("/")[0], run_id)
    return [] if view is None else context_of(view, call_id)


def context_of(view: Any, call_id: str) -> list[dict[str, Any]]:
    """An opened episode's chat up to and including call ``call_id``."""
    index = call_id.rpartition("/")[2]
    out = []
    for message in inspector.chat_messages(view):
        meta = message.get("metadata") or {}
        if meta.get("parent_id") == f"call-{index}":
            break
        out.append(message)
    return out


def show(ctx: Studio, f: QueueFilter, call_id: str | None) -> tuple[str, list, str, str]:
    """(header, context, diff, progress) of the queue at ``call_id`` of run ``f.run_id`` (None:
    the end). The episode is read once for all three views."""
    mine, total = ctx.store.queue.progress(f)
    progress = f"**{mine} / {total}** labelled by you" + (f" in `{f.run_id}`" if total else "")
    if call_id is None:
        done = "Nothing to label with these filters." if not total else "End of the queue."
        return f"{done} Change the filters or the scope.", [], "", progress
    view, why = inspector.lookup(ctx, call_id.rpartition("/")[0], f.run_id)
    if view is None:
        return f"Call `{call_id}`: {why}", [], "", progress
    head, diff = compare.pair_of(view, call_id)
    if not diff:  # no such call in the run: the header says why
        return head, [], "", progress
    link = f" · link: `{inspector.address('annotate', f.run_id, call_id=call_id)}`"
    return f"`{call_id}` · {head}{link}", context_of(view, call_id), diff, progress


def agreement_frame(ctx: Studio, run_id: str | None) -> pd.DataFrame:
    """One row per pair of authors who labelled the same calls of the run."""
    if not run_id:
        return pd.DataFrame(columns=AGREEMENT_COLUMNS)
    rows = []
    for (a, b), got in ctx.store.queue.agreement(run_id).items():
        per = ", ".join(f"{k} {v:.2f}" for k, v in got.per_label.items())
        rows.append(
            {
                "authors": f"{a} · {b}",
                "items": got.n,
                "kappa": round(got.kappa, 3),
                "observed": round(got.observed, 3),
                "per label": per,
            }
        )
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def step(
    ctx: Studio, user: str | None, values: list[Any], at: str | None, back: bool = False
) -> tuple[Any, ...]:
    """Move the queue (from ``at``; None: the start) and render ``build``'s views: (head,
    context, diff, progress, label, current call id)."""
    run_id = values[0]
    if not run_id:
        return ("Pick a run to label.", [], "", "", None, "")
    f = queue_filter(run_id, ctx.policy.author_name(user), *values[1:])
    try:
        nxt = ctx.store.queue.next(f, at, back=back)
    except KeyError as err:
        return (f"**Queue reset:** {err.args[0]}", [], "", "", None, "")
    if back and nxt is None:
        nxt = at  # already at the first item
    return (*show(ctx, f, nxt), None, nxt or "")


Save = Callable[[str | None, str, str, str | None, str], str]


def save_and_next(
    ctx: Studio,
    save: Save,
    user: str | None,
    at: str,
    label: str | None,
    note: str,
    values: list[Any],
) -> tuple[Any, ...]:
    """Label the pair on screen (call ``at`` of the run ``values[0]``) and move on: (the views
    of ``step``, message, note, agreement). A saved label clears the note, so it is not
    attached to the next pair's label; a refused one keeps everything for a retry."""
    keep = (gr.update(),) * 6
    if not at:
        return (*keep, "Start the queue first.", note, gr.update())
    said = save(user, values[0], at, label, note)
    if not said.startswith("Saved"):
        return (*keep, said, note, gr.update())
    return (*step(ctx, user, values, at), said, "", agreement_frame(ctx, values[0]))


def from_link(ctx: Studio, user: str | None, params: dict[str, str]) -> tuple[Any, ...]:
    """(run, the views of ``step``, agreement) for ``?tab=annotate&run=RUN[&call=EP/IDX]``: the
    queue of that run at that pair (its first pair without ``call``)."""
    run_id, call = params.get("run", ""), params.get("call", "")
    f = queue_filter(run_id, ctx.policy.author_name(user), "all", None, None, None, None, None)
    at = call or ctx.store.queue.next(f)
    head, chat, diff, progress = show(ctx, f, at)
    current = at if diff else ""  # a call the run does not hold is not labelled from here
    views = (head, chat, diff, progress, None, current or "")
    return (gr.update(value=run_id), *views, agreement_frame(ctx, run_id))


def build(ctx: Studio, user: gr.State, loads: PageLoads, save: Save) -> None:
    """The queue section; ``save(user, run_id, call_id, label, note) -> message`` stores one
    label."""
    gr.Markdown("### Queue")
    with gr.Row():
        run = gr.Dropdown(pair_runs(ctx), label="run", elem_id="queue-run", scale=2)
        scope = gr.Radio(list(SCOPES), value="unlabelled", label="scope", elem_id="queue-scope")
    with gr.Row():
        tool = gr.Textbox(ANY, label="tool", elem_id="queue-tool")
        rehearsed = gr.Dropdown([ANY, "ok", "error"], value=ANY, label="rehearsed status")
        real = gr.Dropdown([ANY, "ok", "error"], value=ANY, label="real status")
        fid_min = gr.Number(0, label="fidelity ≥", minimum=0, maximum=1)
        fid_max = gr.Number(1, label="fidelity ≤", minimum=0, maximum=1)
    with gr.Row():
        start = gr.Button("Start / restart", elem_id="queue-start")
        back = gr.Button("Back (Alt+←)", elem_id="queue-back")
        skip = gr.Button("Skip", elem_id="queue-skip")
    progress = gr.Markdown(elem_id="queue-progress")
    head = gr.Markdown(elem_id="queue-head")
    chat = gr.Chatbot(label="context up to the call", height=300, elem_id="queue-context")
    diff = gr.HTML(elem_id="queue-diff")
    label = gr.Radio(label_choices("call"), label=label_title("call"), elem_id="queue-label")
    note = gr.Textbox(label="note", lines=1, info=NOTE_INFO, elem_id="queue-note")
    save_btn = gr.Button("Save and next (Enter)", variant="primary", elem_id="queue-save")
    message = gr.Markdown(elem_id="queue-message")
    agree = gr.Dataframe(
        pd.DataFrame(columns=AGREEMENT_COLUMNS),
        interactive=False,
        label="agreement between authors on this run",
        elem_id="queue-agreement",
    )
    # the call id on screen ("" before any): a component value, sent with every event
    current = gr.Textbox(visible=False)
    form = [run, scope, tool, rehearsed, real, fid_min, fid_max]
    views = [head, chat, diff, progress, label, current]
    keep = (gr.update(),) * len(views)

    def begin(u: str | None, *values: Any) -> tuple[Any, ...]:
        return (*step(ctx, u, list(values), None), agreement_frame(ctx, values[0]))

    def move(u: str | None, at: str, *values: Any, back: bool = False) -> tuple[Any, ...]:
        return step(ctx, u, list(values), at or None, back=back)

    def save_next(u: str | None, at: str, lab: str | None, n: str, *values: Any):
        return save_and_next(ctx, save, u, at, lab, n, list(values))

    def again(u: str | None, at: str, *values: Any) -> tuple[Any, ...]:
        """Re-show the current pair (after a sign-in: "labelled by you" is someone else now)."""
        if not values[0] or not at:
            return keep
        f = queue_filter(values[0], ctx.policy.author_name(u), *values[1:])
        return (*show(ctx, f, at), gr.update(), at)

    start.click(begin, [user, *form], [*views, agree])
    user.change(again, [user, current, *form], views)
    run.input(begin, [user, *form], [*views, agree])  # a user's pick, not a deep link's
    skip.click(move, [user, current, *form], views)
    back.click(lambda u, at, *v: move(u, at, *v, back=True), [user, current, *form], views)
    save_btn.click(save_next, [user, current, label, note, *form], [*views, message, note, agree])

    def on_load(u: str | None, request: gr.Request) -> tuple[Any, ...]:
        params = dict(request.query_params) if request else {}
        # &episode= links to the form below (an episode is no pair): the queue stays as it is
        if not params.get("run") or params.get("episode"):
            return (gr.update(), *keep, gr.update())
        return from_link(ctx, u, params)

    loads.on("annotate", on_load, [user], [run, *views, agree])
