"""Annotate: label a rehearsal (one tool call's rehearsed response) or a whole episode.

Labels are append-only in storage: a new label never overwrites an old one, so the history
shows who changed their mind and when. Keys 1-5 pick a label and Ctrl+Enter saves (script in
studio.app.HEAD); the author comes from the sign-in, never from a text field.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from studio.auth import AuthError
from studio.context import Studio
from studio.pages.runs import run_choices

CALL_LABELS = ("faithful", "plausible-but-wrong", "hallucinated-success", "wrong-error", "other")
EPISODE_LABELS = ("success", "partial", "wrong-plan", "format-error", "world-model-error", "other")
HISTORY_COLUMNS = ["created_at", "run_id", "target_kind", "target_id", "label", "note", "author"]


class AnnotationInputError(ValueError):
    """The annotation form is incomplete; the message says what to fill in."""


def labels_for(kind: str) -> list[str]:
    """Allowed labels for a target kind (``call`` or ``episode``)."""
    return list(CALL_LABELS if kind == "call" else EPISODE_LABELS)


def check(kind: str, target_id: str, labels: list[str] | str | None) -> tuple[str, list[str]]:
    """Validate the form: returns (target id, labels) or raises AnnotationInputError."""
    target_id = (target_id or "").strip()
    chosen = [labels] if isinstance(labels, str) else list(labels or [])
    if kind not in ("call", "episode"):
        raise AnnotationInputError(f"target must be 'call' or 'episode', got {kind!r}")
    if not target_id:
        what = "a call id like EPISODE/0" if kind == "call" else "an episode id"
        raise AnnotationInputError(f"enter {what} to label")
    if kind == "call" and "/" not in target_id:
        raise AnnotationInputError(
            f"{target_id!r} is not a call id: use <episode id>/<call index>, e.g. {target_id}/0"
        )
    if not chosen:
        raise AnnotationInputError("pick a label (keys 1-5 choose one)")
    unknown = [c for c in chosen if c not in labels_for(kind)]
    if unknown:
        raise AnnotationInputError(
            f"unknown label(s) {unknown} for a {kind}: use {labels_for(kind)}"
        )
    return target_id, chosen


def save(
    ctx: Studio,
    user: str | None,
    kind: str,
    target_id: str,
    labels: list[str] | str | None,
    note: str,
    run_id: str | None = None,
) -> tuple[str, pd.DataFrame]:
    """Record the labels (one row each) on ``target_id`` of ``run_id`` (None: the one run that
    holds it) and return (message, the target's history)."""
    run_id = run_id or None
    try:
        author = ctx.policy.author(user, "annotate")
        target_id, chosen = check(kind, target_id, labels)
    except (AuthError, AnnotationInputError) as err:
        return f"**Not saved:** {err}", history(ctx, target_id, run_id)
    try:
        for label in chosen:
            ctx.store.annotate(kind, target_id, label, (note or "").strip(), author, run_id)
    except (KeyError, ValueError) as err:
        reason = err.args[0] if err.args else str(err)
        return f"**Not saved:** {reason}", history(ctx, target_id, run_id)
    said = f"Saved {', '.join(chosen)} on `{target_id}` as **{author}**."
    return said, history(ctx, target_id, run_id)


def history(ctx: Studio, target_id: str | None, run_id: str | None = None) -> pd.DataFrame:
    """Every label on a target (of ``run_id`` when given), newest first (all recent labels
    when no target is given)."""
    df = ctx.store.annotations(target_id=(target_id or "").strip() or None, run_id=run_id or None)
    return df.reindex(columns=HISTORY_COLUMNS)


def export(ctx: Studio, fmt: str) -> list[str]:
    """Write every label, and the agreement between authors per run, to temporary CSV or JSONL
    files; their paths (for download)."""
    folder = Path(tempfile.mkdtemp(prefix="envace-labels-"))
    written = []
    for name, df in (("labels", ctx.store.export_labels()), ("agreement", agreement_rows(ctx))):
        out = folder / f"{name}.{fmt}"
        if fmt == "csv":
            df.to_csv(out, index=False)
        else:
            df.to_json(out, orient="records", lines=True)
        written.append(str(out))
    return written


def agreement_rows(ctx: Studio) -> pd.DataFrame:
    """Per run and pair of authors: items both labelled, kappa, observed and per-label agreement."""
    rows = []
    for run_id in ctx.store.export_labels()["run_id"].dropna().unique():
        for (a, b), got in ctx.store.agreement(str(run_id)).items():
            base = {"run_id": run_id, "author_a": a, "author_b": b, "items": got.n}
            rows.append({**base, "kappa": got.kappa, "observed": got.observed})
            rows[-1].update({f"agree/{k}": v for k, v in got.per_label.items()})
    return pd.DataFrame(rows, columns=None if rows else ["run_id", "author_a", "author_b"])


def build(ctx: Studio, user: gr.State, demo: gr.Blocks) -> None:
    """Lay out the page (the queue first, then the form for any call or episode)."""
    from studio.pages import queue  # here, not at the top: queue imports this module

    queue.build(
        ctx, user, demo, lambda u, r, call, lab, n: save(ctx, u, "call", call, lab, n, r)[0]
    )
    gr.Markdown("### Any call or episode")
    gr.Markdown(
        "Label what the world role rehearsed for one tool call (call id "
        "`<episode id>/<call index>`, shown in *Rehearsed vs real*), or a whole episode. "
        "Keys **1–5** pick a label, **Ctrl+Enter** saves."
    )
    with gr.Row():
        kind = gr.Radio(["call", "episode"], value="call", label="target", elem_id="annot-kind")
        target = gr.Textbox(label="call or episode id", elem_id="annot-target", scale=3)
        run = gr.Dropdown(
            ["", *run_choices(ctx)],
            value="",
            label="run (needed when the id is in several)",
            elem_id="annot-run",
            scale=2,
        )
    label = gr.Radio(list(CALL_LABELS), label="label", elem_id="annot-label")
    note = gr.Textbox(label="note", lines=2, elem_id="annot-note")
    save_btn = gr.Button("Save label", variant="primary", elem_id="annot-save")
    message = gr.Markdown(elem_id="annot-message")
    table = gr.Dataframe(
        pd.DataFrame(columns=HISTORY_COLUMNS),
        interactive=False,
        label="history (newest first)",
        elem_id="annot-history",
        max_height=300,
    )
    with gr.Row():
        fmt = gr.Radio(["csv", "jsonl"], value="csv", label="export format")
        export_btn = gr.Button("Export all labels")
        download = gr.File(label="labels and agreement files", file_count="multiple")

    kind.change(lambda k: gr.update(choices=labels_for(k), value=None), [kind], [label])
    save_btn.click(
        lambda u, k, t, lab, n, r: save(ctx, u, k, t, lab, n, r),
        [user, kind, target, label, note, run],
        [message, table],
    )
    target.change(lambda t, r: history(ctx, t, r), [target, run], [table])
    run.change(lambda t, r: history(ctx, t, r), [target, run], [table])
    export_btn.click(lambda f: export(ctx, f), [fmt], [download])

    def from_link(request: gr.Request) -> tuple[object, ...]:
        params = request.query_params if request else {}
        if params.get("tab") != "annotate":  # a deep link to another page
            return gr.update(), gr.update(), gr.update(), gr.update()
        call, episode = params.get("call", ""), params.get("episode", "")
        chosen, run_id = call or episode, params.get("run", "")
        if not chosen:  # no deep link: nothing to query
            return gr.update(), gr.update(), gr.update(), gr.update()
        kind_now = gr.update(value="call" if call else "episode")
        return kind_now, chosen, gr.update(value=run_id), history(ctx, chosen, run_id)

    demo.load(from_link, None, [kind, target, run, table])
