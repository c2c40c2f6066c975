"""Token layout: the golden mask test, training rows, the append contract and the suffix rule."""

from __future__ import annotations

import pytest

from envace_engine.rollout.prompts import Message
from envace_engine.rollout.tokens import (
    MASK_ACT,
    MASK_NONE,
    MASK_REHEARSE,
    ChatTokenizer,
    TokenSequence,
    rehearsal_segments,
    role_mask,
    training_rows,
)
from envace_engine.types import Episode, Mode, Rehearsal, Role, Segment


def _golden_episode() -> Episode:
    """An episode with every segment role, on small integer tokens.

    Agent context (``Episode.segments``), one sequence::

        tokens  1  2  3 | 10 11 | 20 21 | 12 | 30 31 32 | 13 14 | 40 | 15
        role    prompt  | act   | tool  | act| user     | act   |real| act
        mask    0  0  0 |  1  1 |  0  0 |  1 |  0  0  0 |  1  1 |  0 |  1

    Rehearsals (their own sequences; the first answers the call in act ``10 11``)::

        tokens  50 51 52 | 60 61        tokens  53 54 | 62
        role    prompt   | rehearse      role    prompt| rehearse
        mask     0  0  0 |  2  2         mask     0  0 |  2

    Rows (step-as-sample): act [1 2 3] -> [10 11]; act [1 2 3 10 11 20 21] -> [12];
    act [... 30 31 32] -> [13 14]; act [... 13 14 40] -> [15]; rehearse [50 51 52] -> [60 61];
    rehearse [53 54] -> [62].
    """

    def act(ids, lps):
        return Segment(Role.ACT, ids, "a", lps)

    segments = (
        Segment(Role.PROMPT, (1, 2, 3), "p"),
        act((10, 11), (-0.1, -0.2)),
        Segment(Role.TOOL, (20, 21), "t"),
        act((12,), (-0.3,)),
        Segment(Role.USER, (30, 31, 32), "u"),
        act((13, 14), (-0.4, -0.5)),
        Segment(Role.REAL, (40,), "r"),
        act((15,), (-0.6,)),
    )
    rehearsals = (
        Rehearsal(0, (50, 51, 52), Segment(Role.REHEARSE, (60, 61), "w", (-1.0, -1.1)), True),
        Rehearsal(1, (53, 54), Segment(Role.REHEARSE, (62,), "w", (-1.2,)), False),
    )
    return Episode(
        id="e",
        task_id="t",
        suite="s",
        mode=Mode.REHEARSAL,
        group_id="g",
        segments=segments,
        rehearsals=rehearsals,
        reward=0.5,
    )


def test_golden_masks():
    episode = _golden_episode()
    assert list(episode.token_ids) == [1, 2, 3, 10, 11, 20, 21, 12, 30, 31, 32, 13, 14, 40, 15]
    assert role_mask(episode.segments) == [0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1]
    first, second = (rehearsal_segments(r) for r in episode.rehearsals)
    assert role_mask(first) == [MASK_NONE] * 3 + [MASK_REHEARSE] * 2
    assert role_mask(second) == [MASK_NONE] * 2 + [MASK_REHEARSE]
    assert MASK_ACT == 1 and MASK_REHEARSE == 2


def test_golden_training_rows():
    rows = training_rows(_golden_episode())
    got = [(r.role, list(r.prompt_ids), list(r.completion_ids), list(r.old_logprobs)) for r in rows]
    assert got == [
        (Role.ACT, [1, 2, 3], [10, 11], [-0.1, -0.2]),
        (Role.ACT, [1, 2, 3, 10, 11, 20, 21], [12], [-0.3]),
        (Role.ACT, [1, 2, 3, 10, 11, 20, 21, 12, 30, 31, 32], [13, 14], [-0.4, -0.5]),
        (Role.ACT, [1, 2, 3, 10, 11, 20, 21, 12, 30, 31, 32, 13, 14, 40], [15], [-0.6]),
        (Role.REHEARSE, [50, 51, 52], [60, 61], [-1.0, -1.1]),
        (Role.REHEARSE, [53, 54], [62], [-1.2]),
    ]
    assert {(r.episode_id, r.group_id, r.reward) for r in rows} == {("e", "g", 0.5)}


def test_append_fails_loudly_on_a_length_mismatch():
    seq = TokenSequence()
    seq.append(Role.PROMPT, [1, 2], "p")
    seq.append(Role.ACT, [3], "a", [-0.5])
    assert seq.ids == [1, 2, 3]
    assert [s.role for s in seq.segments] == [Role.PROMPT, Role.ACT]
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        seq.append(Role.ACT, [4, 5], "a", [-0.1])
    with pytest.raises(ValueError, match="none logprobs"):
        seq.append(Role.ACT, [4], "a")
    with pytest.raises(ValueError, match="cannot carry logprobs"):
        seq.append(Role.TOOL, [4], "t", [-0.1])
    assert seq.ids == [1, 2, 3]  # a rejected append changes nothing


def test_suffix_starts_after_the_end_token(tokenizer):
    chat = ChatTokenizer(tokenizer)
    history = [Message("system", "S"), Message("user", "hi")]
    reply = Message("assistant", "calling")
    tool = [Message("tool", '{"a": 1}')]
    stopped = chat.suffix(history, reply, tool, stopped=True)
    assert stopped == '\n<|im_start|>tool\n{"a": 1}<|im_end|>\n<|im_start|>assistant\n'
    cut = chat.suffix(history, reply, [Message("user", "next")], stopped=False)
    assert cut == "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    # prompt + sampled ids + suffix ids equals the full re-render: no drift
    sampled = [*chat.encode("calling"), chat.eos_id]
    segments = _segments(chat.prompt_ids(history), sampled, chat.encode(stopped))
    assert not chat.drifted(segments, [*history, reply, *tool])


def _segments(prompt: list[int], sampled: list[int], suffix: list[int]) -> list[Segment]:
    return [
        Segment(Role.PROMPT, tuple(prompt), ""),
        Segment(Role.ACT, tuple(sampled), "", tuple(0.0 for _ in sampled)),
        Segment(Role.TOOL, tuple(suffix), ""),
    ]


def test_non_canonical_samples_are_not_drift_but_are_detected(tokenizer):
    chat = ChatTokenizer(tokenizer)
    history = [Message("system", "S"), Message("user", "hi")]
    reply = Message("assistant", "hello")
    tool = [Message("tool", "1")]
    # the same text sampled one character per token: decodes identically, tokenises differently
    by_char = [i for ch in "hello" for i in chat.encode(ch)]
    assert chat.decode(by_char) == "hello" and by_char != chat.encode("hello")
    assert chat.canonical([*by_char, chat.eos_id]) == [*chat.encode("hello"), chat.eos_id]
    suffix = chat.encode(chat.suffix(history, reply, tool, stopped=True))
    segments = _segments(chat.prompt_ids(history), [*by_char, chat.eos_id], suffix)
    assert not chat.drifted(segments, [*history, reply, *tool])


def test_drift_is_detected_when_external_tokens_differ_from_the_render(tokenizer):
    chat = ChatTokenizer(tokenizer)
    history = [Message("system", "S"), Message("user", "hi")]
    reply = Message("assistant", "hello")
    tool = [Message("tool", "the printable form")]
    suffix = chat.suffix(history, reply, tool, stopped=True)
    # a builder that tokenised the tool result in pieces would not match the template's ids
    before, after = suffix.split("able", 1)
    pieces = chat.encode(before) + chat.encode("able") + chat.encode(after)
    assert pieces != chat.encode(suffix)
    sampled = [*chat.encode("hello"), chat.eos_id]
    segments = _segments(chat.prompt_ids(history), sampled, pieces)
    assert chat.drifted(segments, [*history, reply, *tool])


def test_sampled_special_tokens_round_trip(tokenizer):
    chat = ChatTokenizer(tokenizer)
    ids = [*chat.encode("a<|im_start|>b"), chat.eos_id]
    assert chat.decode(ids) == "a<|im_start|>b<|im_end|>"
