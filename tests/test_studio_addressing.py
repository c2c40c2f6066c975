"""One address for everything: (run, episode[, call]).

Two runs hold the same episode ids with different content (as two arms of one study do): every
view and link must show, and point at, the run it was asked about; an id asked without a run
that both runs hold gets a message naming both, never one of them picked silently.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from envace_engine.types import ToolResult
from storage.queue import QueueFilter
from storage.shards import RunWriter
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import annotate, compare, inspector, queue, rehearse
from tests.studio_data import episode

A, B = "arm-envace", "arm-act-only"  # A rehearsed "deleted", B "saved"; A failed, B succeeded
EP = "ep-0-1"
CALL = f"{EP}/0"


def _episode(index: int, rehearsed: str, reward: float, prompt_base: int):
    """``tests.studio_data.episode`` whose first call was rehearsed as ``{rehearsed: work}``
    (the real tool said ``saved``) from its own prompt ids."""
    base = episode(index, 0, reward, fail_second=False)
    first = dataclasses.replace(
        base.calls[0],
        rehearsed=ToolResult(value={rehearsed: "work"}),
        real=ToolResult(value={"saved": "work"}),
    )
    prompts = tuple(
        dataclasses.replace(r, prompt_ids=(prompt_base, prompt_base + 1, prompt_base + 2))
        for r in base.rehearsals
    )
    return dataclasses.replace(base, calls=(first, *base.calls[1:]), rehearsals=prompts)


def _run(root: Path, run_id: str, rehearsed: str, reward: float, prompt_base: int) -> None:
    with RunWriter.create(root, "train", model="tiny", suite="toy", run_id=run_id) as writer:
        writer.episodes(0, [_episode(i, rehearsed, reward, prompt_base) for i in range(3)])


@pytest.fixture
def ctx(tmp_path):
    _run(tmp_path, A, "deleted", 0.0, 100)
    _run(tmp_path, B, "saved", 1.0, 200)
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


def _links(markdown: str) -> list[str]:
    return re.findall(r"\?tab=[^)`\s]+", markdown)


def _names_both(message: str) -> bool:
    return A in message and B in message


def _text(messages: list[dict]) -> str:
    return "\n".join(str(m["content"]) for m in messages)


def test_the_inspector_opens_the_asked_runs_episode(ctx):
    for run_id, rehearsed, reward in ((A, "deleted", "0.000"), (B, "saved", "1.000")):
        chat, head, _, links = inspector.open_episode(ctx, EP, run_id)
        assert f"run `{run_id}`" in head and f"| {reward} |" in head
        assert f'"{rehearsed}": "work"' in _text(chat)
        assert _links(links) and all(f"run={run_id}&" in q for q in _links(links))


def test_an_episode_in_two_runs_without_a_run_names_both(ctx):
    chat, head, tokens, _ = inspector.open_episode(ctx, EP)
    assert chat == [] and tokens == "" and _names_both(head)
    # the message links each run's episode
    assert {f"?tab=inspector&run={A}&episode={EP}", f"?tab=inspector&run={B}&episode={EP}"} <= set(
        _links(head)
    )


def test_the_inspector_deep_link(ctx):
    episode_id, picker, _, _, _, chat, head, _, _ = inspector.deep_link(ctx, {"episode": EP})
    assert episode_id == EP and chat == [] and _names_both(head)
    _, picker, table, _, _, chat, head, _, links = inspector.deep_link(
        ctx, {"episode": EP, "run": B}
    )
    assert picker["value"] == B and set(table["episode_id"]) == {"ep-0-0", EP, "ep-0-2"}
    assert f"run `{B}`" in head and '"saved": "work"' in _text(chat)
    assert all(f"run={B}&" in q for q in _links(links))


def test_next_failure_stays_in_its_run(ctx):
    found, _, head, _, links = inspector.jump_to_failure(ctx, A, "")
    assert found == "ep-0-0" and f"run `{A}`" in head and "| 0.000 |" in head
    assert all(f"run={A}&" in q for q in _links(links))
    found, *_ = inspector.jump_to_failure(ctx, A, "ep-0-0")
    assert found == EP
    _, _, _, _, message = inspector.jump_to_failure(ctx, B, "")  # B failed nothing
    assert f"No failed episode in run `{B}`" in message


def test_open_in_the_picked_run_says_where_else_the_id_is(ctx):
    _, head, _, _ = inspector.open_episode(ctx, "ep-0-9", A)
    assert f"No episode `ep-0-9` in run `{A}`" in head
    with RunWriter.create(ctx.root, "train", run_id="only-here") as writer:
        writer.episodes(0, [dataclasses.replace(episode(0, 0, 1.0), id="lonely")])
    _, head, _, _ = inspector.open_episode(ctx, "lonely", A)
    assert "It is in [`only-here`](?tab=inspector&run=only-here&episode=lonely)" in head


def test_the_pair_detail_shows_the_listed_runs_pair(ctx):
    for run_id, rehearsed in ((A, "deleted"), (B, "saved")):
        pairs, _, _ = compare.pairs_table(ctx, run_id, "get_stock", "", 0, 1, 1)
        row = pairs[pairs["call_id"] == CALL].iloc[0]
        head, diff = compare.pair_detail(ctx, CALL, run_id)
        assert f"run `{run_id}`" in head and f"fidelity **{row['fidelity']:.3f}**" in head
        assert f"&quot;{rehearsed}&quot;: &quot;work&quot;" in diff
        links = _links(head)
        assert f"?tab=inspector&run={run_id}&episode={EP}" in links
        assert f"?tab=annotate&run={run_id}&call={CALL}" in links
    head, diff = compare.pair_detail(ctx, CALL, None)
    assert diff == "" and _names_both(head)


def test_the_queue_header_context_and_diff_are_the_queues_run(ctx):
    for run_id, rehearsed in ((A, "deleted"), (B, "saved")):
        f = QueueFilter(run_id=run_id, author="ana", scope="all")
        head, context, diff, _ = queue.show(ctx, f, CALL)
        assert f"run `{run_id}`" in head and f"&quot;{rehearsed}&quot;" in diff
        assert all(f"run={run_id}&" in q for q in _links(head))
        assert context and context == queue.context_messages(ctx, CALL, run_id)
        assert context[-1]["metadata"]["title"] == "tool call 0: get_stock"


def test_the_queue_deep_link_opens_that_runs_pair(ctx):
    run, head, _, diff, _, _, current, _ = queue.from_link(ctx, None, {"run": B, "call": CALL})
    assert run["value"] == B and current == CALL
    assert f"run `{B}`" in head and "&quot;saved&quot;" in diff
    _, head, _, diff, _, _, current, _ = queue.from_link(ctx, None, {"run": B, "call": f"{EP}/7"})
    assert diff == "" and current == "" and "has no call 7" in head


def test_a_label_goes_to_the_named_run_and_needs_one(ctx):
    message, _ = annotate.save(ctx, "ana", "call", CALL, "faithful", "")
    assert message.startswith("**Not saved:**") and _names_both(message)
    message, history = annotate.save(ctx, "ana", "call", CALL, "hallucinated-success", "", B)
    assert message.startswith("Saved") and f"run `{B}`" in message
    assert list(history["run_id"]) == [B]
    assert annotate.history(ctx, CALL, A).empty
    kind, target, run, _, _ = annotate.from_link(ctx, {"run": A, "call": CALL})
    assert (kind, target, run["value"]) == ("call", CALL, A)


class FakeClient:
    """Records the worker request; answers like the worker does."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def ask(self, request: dict) -> dict:
        self.asked.append(request)
        return {
            "text": '<execution_result>{"ok": 1}</execution_result>',
            "result": {"ok": 1},
            "result_error": None,
            "error": None,
            "tokens": 3,
            "seconds": 0.1,
            "load_s": 0.0,
            "finish_reason": "stop",
            "model": request["model"],
        }


def test_live_rehearse_uses_the_named_runs_prompt_and_episode(ctx):
    calls, status, run, _ = rehearse.load_episode(ctx, EP, B)
    assert run == B and list(calls["call_index"]) == [0, 1] and f"run `{B}`" in status
    calls, status, run, wanted = rehearse.load_episode(ctx, EP, None)
    assert calls.empty and run == "" and wanted is None and _names_both(status)
    client = FakeClient()
    _, stored, real, _ = rehearse.live_rehearse(ctx, client, EP, 0, "tiny", 0.0, A)
    assert client.asked[-1]["prompt_ids"] == [100, 101, 102]  # A's stored rehearse prompt
    assert '"deleted": "work"' in stored and '"saved": "work"' in real
    live, *_ = rehearse.live_rehearse(ctx, client, EP, 0, "tiny", 0.0, "")
    assert _names_both(live) and len(client.asked) == 1  # nothing asked of the worker
