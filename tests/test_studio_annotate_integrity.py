"""Annotation integrity: a label lands on a call that exists, in the run named; a note is
bounded and never rides along with the next label; every label has a key."""

from __future__ import annotations

import pandas as pd
import pytest

from storage.store import NOTE_MAX_CHARS
from studio.app import HEAD
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import annotate, queue
from tests.studio_data import make_run


@pytest.fixture
def ctx(tmp_path):
    make_run(tmp_path)
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        (
            "ep-0-1/99",
            "no call `ep-0-1/99` in run `train-demo`: episode `ep-0-1` made calls 0 to 1",
        ),
        ("ep-0-1/-1", "the call index after '/' must be a whole number from 0 (got '-1')"),
        ("ep-0-1/", "must be a whole number from 0 (got '')"),
        ("ep-0-1/one", "(got 'one')"),
        ("/0", "is not a call id"),
        ("ep-9-9/0", "No episode `ep-9-9` in run `train-demo`"),
    ],
)
def test_a_label_on_a_call_that_does_not_exist_is_refused(ctx, monkeypatch, target, needle):
    stored = []
    monkeypatch.setattr(ctx.store, "annotate", lambda *a, **k: stored.append(a))
    message, _ = annotate.save(ctx, "ana", "call", target, "faithful", "", "train-demo")
    assert message.startswith("**Not saved:**") and needle in message
    assert stored == []  # the page refused it before storage was asked


def test_refused_labels_stay_out_of_the_export(ctx):
    for target in ("ep-0-1/99", "ep-0-1/-1"):
        annotate.save(ctx, "ana", "call", target, "faithful", "", "train-demo")
    message, _ = annotate.save(ctx, "ana", "call", "ep-0-1/1", "faithful", "", "train-demo")
    assert message.startswith("Saved")
    assert list(ctx.store.export_labels()["target_id"]) == ["ep-0-1/1"]


def test_the_note_has_a_limit(ctx):
    long = "x" * (NOTE_MAX_CHARS + 1)
    message, _ = annotate.save(ctx, "ana", "episode", "ep-0-1", "success", long, "train-demo")
    assert message.startswith("**Not saved:**") and f"at most {NOTE_MAX_CHARS}" in message
    full = "x" * NOTE_MAX_CHARS
    message, history = annotate.save(ctx, "ana", "episode", "ep-0-1", "success", full)
    assert message.startswith("Saved") and history["note"].tolist() == [full]
    assert str(NOTE_MAX_CHARS) in annotate.NOTE_INFO  # the field says so


def test_a_save_clears_the_note_and_the_label(ctx):
    message, _, note, label = annotate.submit(
        ctx, "ana", "call", "ep-0-1/1", "other", "see the real error", "train-demo"
    )
    assert message.startswith("Saved") and note == "" and label is None
    message, _, note, label = annotate.submit(
        ctx, "ana", "call", "ep-0-1/7", "other", "kept for a retry", "train-demo"
    )
    assert message.startswith("**Not saved:**")
    assert (note, label) == ("kept for a retry", "other")


def test_the_queue_clears_the_note_after_each_save(ctx):
    def save(u, run_id, call, lab, n):
        return annotate.save(ctx, u, "call", call, lab, n, run_id)[0]

    values = ["train-demo", "all", "any", "any", "any", 0, 1]
    first = queue.step(ctx, "ana", values, None)[-1]
    out = queue.save_and_next(ctx, save, "ana", first, "faithful", "one note", values)
    head, _, _, _, label, current, message, note, agreement = out
    assert message.startswith("Saved") and note == "" and label is None
    assert current and current != first and current in head
    assert isinstance(agreement, pd.DataFrame)
    out = queue.save_and_next(ctx, save, "ana", current, "faithful", "second note", values)
    labels = ctx.store.annotations(run_id="train-demo")
    assert dict(zip(labels["target_id"], labels["note"], strict=True)) == {
        first: "one note",
        current: "second note",  # not "one note" again
    }
    refused = queue.save_and_next(ctx, save, "ana", "ep-0-1/9", "faithful", "keep", values)
    assert refused[6].startswith("**Not saved:**") and refused[7] == "keep"


def test_every_label_has_a_key_shown_beside_it():
    calls, episodes = annotate.label_choices("call"), annotate.label_choices("episode")
    assert len(calls) == len(annotate.CALL_LABELS) == 5
    assert len(episodes) == len(annotate.EPISODE_LABELS) == 6
    assert episodes[5] == ("6 · other", "other")
    assert [v for _, v in episodes] == list(annotate.EPISODE_LABELS)
    assert annotate.label_title("episode") == "label (keys 1–6)"
    assert annotate.label_title("call") == "label (keys 1–5)"
    # the keyboard script reaches as many labels as a radio has (up to 9), not a fixed 5
    assert "/^[1-9]$/" in HEAD and "n <= boxes.length" in HEAD
