"""A simulated-user episode (new segment role, new stop reason, meta) goes through storage and
is shown in the studio inspector with its user turns marked as simulated."""

from __future__ import annotations

from pathlib import Path

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.user import ScriptedUser
from envace_engine.types import Mode, StopReason
from storage.shards import RunWriter
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import inspector
from tests.kv_world import ScriptedSampler, call_text, last_message


def _agent(prompt: str) -> str:
    role, _ = last_message(prompt)
    if role == "tool":
        return "Task task_1 is now completed."
    return call_text("update_task_status", task_id="task_1", status="completed")


def test_simulated_user_turns_are_stored_and_shown(tmp_path: Path, tokenizer) -> None:
    suite = get_suite("tau2-mock")
    task = next(t for t in suite.tasks("base") if t.meta["tau2_id"] == "update_task_1")
    user = ScriptedUser({task.id: ["Please complete task_1."]})
    config = RolloutConfig(mode=Mode.REAL, n_examples=0, user=user)
    (ep,) = rollout(
        [task], suite, ScriptedSampler(tokenizer, _agent), tokenizer, config, run_id="u"
    )
    assert ep.stop_reason is StopReason.USER_STOP
    with RunWriter.create(tmp_path, "eval", run_id="sim") as writer:
        writer.episodes(0, [ep])
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    try:
        messages, head, tokens, _ = inspector.open_episode(studio, ep.id)
    finally:
        studio.store.close()
    simulated = [m for m in messages if m.get("metadata", {}).get("title") == "simulated user"]
    assert len(simulated) == 2  # the opening and the stop message
    assert "Please complete task_1." in simulated[0]["content"]
    assert "###STOP###" in simulated[1]["content"]
    assert "user_stop" in head
    # an evaluation trains nothing: its act tokens are sampled, not trained
    assert "act (sampled, not trained)" in tokens and "not trained" in tokens
    assert "act (trained)" not in tokens  # the token view names only the kinds it draws
