"""Annotate: label a rehearsal (one tool call's rehearsed response) or a whole episode.

A label's target is (run, call) or (run, episode): ids repeat across runs, so a label is always
stored with its run, and an id without a run that several runs hold is refused with their
names. A label on a call the episode does not have is refused before it reaches storage.

Labels are append-only in storage: a new label never overwrites an old one, so the history
shows who changed their mind and when. Every label has a key (1–5 for a call, 1–6 for an
episode, shown beside it) and Ctrl+Enter saves (script in studio.app.HEAD); a saved label
clears the note, so one note is not attached to the next label. The author comes from the
sign-in, never from a text field.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from storage.store import NOTE_MAX_CHARS
from studio.auth import AuthError
from studio.context import Studio
from studio.lazy import PageLoads
from studio.pages import inspector
from studio.pages.runs import run_choices

CALL_LABELS = ("faithful", "plausible-but-wrong", "hallucinated-success", "wrong-error", "other")
EPISODE_LABELS = ("success", "partial", "wrong-plan", "format-error", "world-model-error", "other")
HISTORY_COLUMNS = ["created_at", "run_id", "target_kind", "target_id", "label", "note", "author"]
NOTE_INFO = f"optional; at most {NOTE_MAX_CHARS} characters; cleared after each save"


class AnnotationInputError(ValueError):
    """The annotation form is incomplete; the message says what to fill in."""


def labels_for(kind: str) -> list[str]:
    """Allowed labels for a target kind (``call`` or ``episode``)."""
    return list(CALL_LABELS if kind == "call" else EPISODE_LABELS)


def label_choices(kind: str) -> list[tuple[str, str]]:
    """(shown, value) radio choices: each label beside the key that picks it (1, 2, ...)."""
    return [(f"{i} · {label}", label) for i, label in enumerate(labels_for(kind), start=1)]


def label_title(kind: str) -> str:
    """The label radio's title, with the keys that reach every label of ``kind``."""
    return f"label (keys 1–{len(labels_for(kind))})"


def check(
    kind: str, target_id: str, labels: list[str] | str | None, note: str = ""
) -> tuple[str, list[str]]:
    """Validate the form: returns (target id, labels) or raises AnnotationInputError."""
    target_id = (target_id or "").strip()
    chosen = [labels] if isinstance(labels, str) else list(labels or [])
    if kind not in ("call", "episode"):
        raise AnnotationInputError(f"target must be 'call' or 'episode', got {kind!r}")
    if not target_id:
        what = "a call id like EPISODE/0" if kind == "call" else "an episode id"
        raise AnnotationInputError(f"enter {what} to label")
    if kind == "call":
        episode, _, index = target_id.rpartition("/")
        if not episode:
            raise AnnotationInputError(
                f"{target_id!r} is not a call id: use <episode id>/<call index>, e.g. {target_id}/0"
            )
        if not index.isdigit():
            raise AnnotationInputError(
                f"{target_id!r}: the call index after '/' must be a whole number from 0 "
                f"(got {index!r})"
            )
    if not chosen:
        raise AnnotationInputError(f"pick a label ({label_title(kind)} choose one)")
    unknown = [c for c in chosen if c not in labels_for(kind)]
    if unknown:
        raise AnnotationInputError(
            f"unknown label(s) {unknown} for a {kind}: use {labels_for(kind)}"
        )
    if len(note or "") > NOTE_MAX_CHARS:
        raise AnnotationInputError(
            f"the note has {len(note)} characters; at most {NOTE_MAX_CHARS} fit: shorten it"
        )
    return target_id, chosen


def target_run(ctx: Studio, kind: str, target_id: str, run_id: str | None) -> str:
    """The run whose episode (or call) ``target_id`` is, checked to exist there; raises
    AnnotationInputError saying why not (no such episode or call in the run, or several runs
    hold the id and none was picked)."""
    episode = target_id.rpartition("/")[0] if kind == "call" else target_id
    view, why = inspector.lookup(ctx, episode, run_id, tab="annotate")
    if view is None:
        raise AnnotationInputError(why)
    run = str(view.episode["run_id"])
    if kind == "call":
        index = int(target_id.rpartition("/")[2])
        have = sorted(int(i) for i in view.calls["call_index"])
        if index not in have:
            made = f"calls {have[0]} to {have[-1]}" if have else "no tool call"
            raise AnnotationInputError(
                f"no call `{target_id}` in run `{run}`: episode `{episode}` made {made}"
            )
    return run


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
    note = (note or "").strip()
    try:
        author = ctx.policy.author(user, "annotate")
        target_id, chosen = check(kind, target_id, labels, note)
        run_id = target_run(ctx, kind, target_id, run_id)
        for label in chosen:  # the run is always named: storage never guesses it
            ctx.store.annotate(kind, target_id, label, note, author, run_id)
    except (AuthError, AnnotationInputError, KeyError, ValueError) as err:
        reason = err.args[0] if err.args else str(err)
        return f"**Not saved:** {reason}", history(ctx, target_id, run_id)
    said = f"Saved {', '.join(chosen)} on `{target_id}` of run `{run_id}` as **{author}**."
    return said, history(ctx, target_id, run_id)


def submit(
    ctx: Studio,
    user: str | None,
    kind: str,
    target_id: str,
    labels: list[str] | str | None,
    note: str,
    run_id: str | None = None,
) -> tuple[str, pd.DataFrame, str, str | None]:
    """The form's save: (message, history, note, label). A saved label clears the note and the
    label, so neither rides along with the next target's; a refused one keeps them."""
    message, table = save(ctx, user, kind, target_id, labels, note, run_id)
    if message.startswith("Saved"):
        return message, table, "", None
    return message, table, note, labels if isinstance(labels, str) else None


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
        for (a, b), got in ctx.store.queue.agreement(str(run_id)).items():
            base = {"run_id": run_id, "author_a": a, "author_b": b, "items": got.n}
            rows.append({**base, "kappa": got.kappa, "observed": got.observed})
            rows[-1].update({f"agree/{k}": v for k, v in got.per_label.items()})
    return pd.DataFrame(rows, columns=None if rows else ["run_id", "author_a", "author_b"])


def from_link(ctx: Studio, params: dict[str, str]) -> tuple[object, ...]:
    """(kind, target, run, label radio, history) for ``?tab=annotate&run=RUN&call=EP/IDX`` or
    ``&episode=ID``."""
    call, episode = params.get("call", ""), params.get("episode", "")
    chosen, run_id = call or episode, params.get("run", "")
    kind = "call" if call else "episode"
    radio = gr.update(choices=label_choices(kind), value=None, label=label_title(kind))
    return kind, chosen, gr.update(value=run_id), radio, history(ctx, chosen, run_id)


def build(ctx: Studio, user: gr.State, loads: PageLoads) -> None:
    """Lay out the page (the queue first, then the form for any call or episode)."""
    from studio.pages import queue  # here, not at the top: queue imports this module

    queue.build(
        ctx, user, loads, lambda u, r, call, lab, n: save(ctx, u, "call", call, lab, n, r)[0]
    )
    with gr.Column(elem_id="annot-form"):  # keys label here once the form was last touched
        gr.Markdown("### Any call or episode")
        gr.Markdown(
            "Label what the world role rehearsed for one tool call (call id "
            "`<episode id>/<call index>`, shown in *Rehearsed vs real*), or a whole episode, "
            "of the run picked here. Keys **1–5** (a call) or **1–6** (an episode) pick a "
            "label, **Ctrl+Enter** saves."
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
        label = gr.Radio(label_choices("call"), label=label_title("call"), elem_id="annot-label")
        note = gr.Textbox(
            label="note",
            lines=2,
            max_length=NOTE_MAX_CHARS,
            info=NOTE_INFO,
            elem_id="annot-note",
        )
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

    kind.input(
        lambda k: gr.update(choices=label_choices(k), value=None, label=label_title(k)),
        [kind],
        [label],
    )
    save_btn.click(
        lambda u, k, t, lab, n, r: submit(ctx, u, k, t, lab, n, r),
        [user, kind, target, label, note, run],
        [message, table, note, label],
    )
    target.change(lambda t, r: history(ctx, t, r), [target, run], [table])
    run.change(lambda t, r: history(ctx, t, r), [target, run], [table])
    export_btn.click(lambda f: export(ctx, f), [fmt], [download])

    def on_load(request: gr.Request) -> tuple[object, ...]:
        params = dict(request.query_params) if request else {}
        if not (params.get("call") or params.get("episode")):
            return tuple(gr.update() for _ in range(5))  # no deep link: nothing to query
        return from_link(ctx, params)

    loads.on("annotate", on_load, (), [kind, target, run, label, table])
