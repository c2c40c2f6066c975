"""Live rehearse says which model answers, and warns when it is not the run's own."""

from __future__ import annotations

import pytest

from storage.shards import RunWriter
from studio import rehearse_worker
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import rehearse
from tests.studio_data import episode, make_run
from tests.test_studio_addressing import FakeClient

WARNING = "⚠️ **Not the run's model.**"


@pytest.fixture
def ctx(tmp_path):
    make_run(tmp_path)  # a train run of "tiny", steps 0 and 1, no checkpoints kept
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


def checkpoint(ctx, run_id: str, step: int):
    folder = ctx.store.run(run_id).path / "checkpoints" / f"step-{step:06d}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_a_missing_checkpoint_falls_back_to_the_base_model_with_a_warning(ctx):
    calls, _, run, wanted = rehearse.load_episode(ctx, "ep-1-0", "train-demo")
    assert run == "train-demo" and list(calls["call_index"]) == [0, 1]
    assert wanted == rehearse.RunModel("checkpoint `step-000001` of run `train-demo`", None)
    picker, note = rehearse.model_picker(wanted)
    assert picker["value"] == rehearse.BASE_MODEL
    assert note.startswith(WARNING) and "`smollm2-135m` answers" in note
    assert "`step-000001` of run `train-demo`, which is not on this machine" in note


def test_the_runs_checkpoint_of_the_episodes_step_answers_when_present(ctx):
    folder = checkpoint(ctx, "train-demo", 1)
    *_, wanted = rehearse.load_episode(ctx, "ep-1-0", "train-demo")
    picker, note = rehearse.model_picker(wanted)
    assert picker["value"] == str(folder) and str(folder) in picker["choices"]
    assert note.startswith(f"**Answers:** `{folder}`") and WARNING not in note
    # picking another model by hand brings the warning back
    assert rehearse.model_note(wanted, "tiny").startswith(WARNING)


def test_step_zero_and_evaluations_use_the_runs_model(ctx, tmp_path):
    *_, wanted = rehearse.load_episode(ctx, "ep-0-0", "train-demo")  # before any update
    assert wanted.own == "tiny" and rehearse.model_note(wanted, "tiny").startswith("**Answers:**")
    gone = str(tmp_path / "nowhere" / "checkpoints" / "step-000040")
    with RunWriter.create(tmp_path, "eval", model=gone, run_id="eval-x") as writer:
        writer.episodes(0, [episode(0, 0, 1.0, prefix="ev")])
    *_, wanted = rehearse.load_episode(ctx, "ev-0-0", "eval-x")
    assert wanted.own is None and gone in wanted.wanted
    assert rehearse.model_note(wanted, rehearse.BASE_MODEL).startswith(WARNING)


def test_every_answer_names_its_model_and_warns(ctx):
    client = FakeClient()
    *_, timing = rehearse.live_rehearse(ctx, client, "ep-1-0", 1, "smollm2-135m", 0.0, "train-demo")
    assert client.asked[-1]["model"] == "smollm2-135m"
    assert WARNING in timing and "`smollm2-135m` answers" in timing
    folder = checkpoint(ctx, "train-demo", 1)
    *_, timing = rehearse.live_rehearse(ctx, client, "ep-1-0", 1, str(folder), 0.0, "train-demo")
    assert WARNING not in timing and f"**Answers:** `{folder}`" in timing


def test_the_worker_never_picks_a_model_itself():
    models = rehearse_worker._Models()
    for request in ({"prompt_ids": [1, 2]}, {"model": " ", "prompt_ids": [1]}, {"kind": "call"}):
        assert "name the model" in rehearse_worker.answer(models, request)["error"]
    assert models.loaded == {}
