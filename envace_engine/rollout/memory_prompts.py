"""The rehearsal-memory prompts (docs/method.md §5): what the memory is written from, and how a
committed episode carries it.

Rendering only, no sampling (that is ``testtime.memory``), so that SFT can build
memory-conditioned examples with exactly the text test-time rehearsal uses
(``training.sft.memory``).

* ``transcript`` — what the agent *saw* in one imagined episode: each call with the result it
  was shown (or the structured error), the final answers and the stop reason.
* ``memory_messages`` — the fresh two-message chat the policy writes a memory from (the task's
  request, an earlier memory in sequential rehearsal, the transcripts).
* ``with_memory`` — a task copy whose context text ends with the memory block: the act prompt
  renders it at the head of the first user message (``prompts.first_user_text``), after the
  task's own context, so the shared system message keeps its token prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from envace_engine.rollout.parsing import result_to_json
from envace_engine.rollout.prompts import Message, dumps
from envace_engine.types import Episode, Task, TaskKey, ToolCall, ToolResult

MEMORY_SYSTEM = """\
You just rehearsed a task privately, in your imagination: every tool result below was imagined \
by you, not returned by the real tools. Write a short rehearsal memory for your real attempt, \
in three parts:
Failed: what went wrong or looked risky (malformed calls, errors, wrong tools or arguments).
Results: what the tool results looked like (fields, values).
Plan: the tool calls to make, in order, and what to answer.
At most six short lines of plain text."""

MEMORY_HEADER = (
    "Rehearsal memory (your notes from a private rehearsal; its tool results were imagined and "
    "may be wrong, and the real tools have not been called yet):"
)


@dataclass(frozen=True)
class Seen:
    """One call of an imagined episode as the agent saw it: the call and the result shown."""

    turn: int
    call: ToolCall
    result: ToolResult | None  # None: the episode ended before the call got an answer


def transcript(episode: Episode, max_chars: int) -> str:
    """What the agent saw in one imagined episode: calls with imagined results, answers, ending."""
    seen = []
    for record in episode.calls:
        seen.append(Seen(record.turn, record.call, record.seen()))
    ending = str(episode.stop_reason)
    if episode.stop_detail:
        ending += f" ({episode.stop_detail})"
    return render_transcript(seen, episode.final_answers, ending, max_chars)


def render_transcript(
    seen: Sequence[Seen], answers: Sequence[str], ending: str, max_chars: int
) -> str:
    """The transcript text: one line per call, one per final answer, then how it ended."""
    lines: list[str] = []
    for item in seen:
        answer = dumps(result_to_json(item.result)) if item.result is not None else "(no result)"
        lines.append(
            f"turn {item.turn + 1} call {item.call.name} {dumps(item.call.arguments)} -> {answer}"
        )
    for turn, text in enumerate(answers):
        lines.append(f"turn {turn + 1} answer: {text.strip()}")
    lines.append(f"ended: {ending}")
    text = "\n".join(lines)
    # Keep the end: the ending and the last calls say most about what failed.
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3) :]


def memory_messages(
    task: Task, transcripts: Sequence[str], previous: str = "", first_index: int = 1
) -> list[Message]:
    """The memory prompt: the task's request, an earlier memory (sequential) and transcripts."""
    parts = ["Task:\n" + "\n".join(f"turn {i + 1}: {t}" for i, t in enumerate(task.user_turns))]
    if previous.strip():
        parts.append("Your memory so far:\n" + previous.strip())
    for k, text in enumerate(transcripts, first_index):
        parts.append(f"Imagined attempt {k}:\n{text}")
    parts.append("Write the rehearsal memory now.")
    return [Message("system", MEMORY_SYSTEM), Message("user", "\n\n".join(parts))]


def with_memory(task: Task, memory: str) -> Task:
    """A copy of ``task`` whose context text (``Task.system``) ends with the memory block
    (``task`` itself when the memory is empty). The block is also kept in ``meta``
    (``TaskKey.MEMORY``) so the world role's prompt can leave it out: the memory is the agent's
    private note, which no environment reads."""
    if not memory.strip():
        return task
    block = f"{MEMORY_HEADER}\n{memory.strip()}"
    system = f"{task.system.strip()}\n\n{block}" if task.system.strip() else block
    return replace(task, system=system, meta={**task.meta, TaskKey.MEMORY: block})
