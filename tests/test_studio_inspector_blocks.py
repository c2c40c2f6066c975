"""The inspector reads as a conversation: the request visible, calls and answers as labelled
blocks, no chat-template tokens in the bubbles, a token view whose tokens say their log-prob and
advantage on hover, rounded numbers, and pagers that answer out-of-range pages with a message."""

from __future__ import annotations

import html
import re

import pytest

from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    StopReason,
    ToolCall,
    ToolResult,
)
from storage.shards import RunWriter
from studio.auth import AuthPolicy
from studio.context import Studio
from studio.pages import compare, inspector
from tests.studio_data import make_run, seg

REQUEST = "Save a note 'work' saying 'email tea'."
TEMPLATE = ("<tool_call>", "</tool_call>", "<|im_end|>", "<|im_start|>", "<|endoftext|>")


def notes_episode() -> Episode:
    """An episode as the demo's SmolLM2 runs store it: ChatML around every turn."""
    write = ToolCall("write_note", {"title": "work", "text": "email tea"})
    listing = ToolCall("find", {"where": {"title": "work"}, "limit": 2})
    calls = (
        CallRecord(
            0,
            1,
            write,
            "rehearsed",
            rehearsed=ToolResult(value={"deleted": "work"}),
            real=ToolResult(value={"saved": "work"}),
        ),
        CallRecord(
            1,
            3,
            listing,
            "rehearsed",
            rehearsed=ToolResult(value={"n": 1}),
            real=ToolResult(value={"n": 4}),
        ),
    )
    segments = (
        seg(Role.PROMPT, f"You manage a notes store. Notes: 'trip'.\n\n{REQUEST}", (1, 2, 3)),
        seg(
            Role.ACT,
            '<tool_call>\n{"name": "write_note", "arguments": {"title": "work", "text": '
            '"email tea"}}\n</tool_call><|im_end|>',
            (4, 5, 6),
        ),
        seg(
            Role.TOOL,
            '\n<|im_start|>tool\n{"deleted": "work"}<|im_end|>\n<|im_start|>assistant\n',
            (7,),
        ),
        seg(Role.ACT, "Done.<|im_end|>", (8, 9)),
        seg(
            Role.USER,
            "\n<|im_start|>user\nHow many notes do I have now?<|im_end|>\n<|im_start|>assistant\n",
            (10, 11),
        ),
        seg(
            Role.ACT,
            'Let me look.<tool_call>{"name": "find", "arguments": {}}</tool_call><|im_end|>',
            (12, 13),
        ),
        seg(Role.TOOL, '\n<|im_start|>tool\n{"n": 1}<|im_end|>\n', (14,)),
        seg(Role.ACT, "4<|im_end|>", (15,)),
    )
    rehearsals = tuple(
        Rehearsal(
            i, (1, 2), seg(Role.REHEARSE, "<execution_result>{}</execution_result>", (20,)), True
        )
        for i in range(2)
    )
    return Episode(
        id="notes-0",
        task_id="notes-1",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id="g",
        segments=segments,
        rehearsals=rehearsals,
        calls=calls,
        reward=1 / 3,
        stop_reason=StopReason.DONE,
        meta={"advantages": {"act": 0.123456, "rehearse": -0.25}},
    )


@pytest.fixture
def ctx(tmp_path):
    make_run(tmp_path, steps=3, per_step=40)  # 120 episodes: three pages of 50
    # a model this machine has no tokenizer for: the token view shows ids
    with RunWriter.create(tmp_path, "train", model="elsewhere/none", run_id="notes") as writer:
        writer.episodes(0, [notes_episode()])
    studio = Studio.open(tmp_path, AuthPolicy.from_settings(None, space_id=""))
    yield studio
    studio.store.close()


def opened(ctx):
    return inspector.open_episode(ctx, "notes-0", "notes")


def test_no_template_tokens_in_the_bubbles(ctx):
    chat, *_ = opened(ctx)
    for message in chat:
        for token in TEMPLATE:
            assert token not in message["content"], (token, message)
    replies = [m["content"] for m in chat if m["role"] == "assistant" and not m.get("metadata")]
    # the first reply was nothing but a call: its block shows it, no empty bubble
    assert replies == ["Done.", "Let me look.", "4"]


def test_the_users_request_is_a_user_bubble(ctx):
    chat, *_ = opened(ctx)
    users = [m for m in chat if m["role"] == "user"]
    assert users[0]["metadata"]["title"].startswith("task context")  # collapsed
    assert users[0]["content"] == "You manage a notes store. Notes: 'trip'."
    assert users[1] == {"role": "user", "content": REQUEST}  # no metadata: shown open
    assert users[2] == {"role": "user", "content": "How many notes do I have now?"}


def test_calls_and_answers_are_labelled_blocks(ctx):
    chat, *_ = opened(ctx)
    blocks = {m["metadata"]["title"]: m for m in chat if "id" in m.get("metadata", {})}
    write = blocks["tool call 0: write_note"]["content"]
    assert "**tool** `write_note`" in write
    assert '| `title` | `"work"` |' in write and '| `text` | `"email tea"` |' in write
    assert "fidelity" in blocks["tool call 0: write_note"]["metadata"]["log"]
    nested = blocks["tool call 1: find"]["content"]  # a nested value: indented JSON
    assert "**arguments**" in nested and '"where": {\n    "title": "work"\n  }' in nested
    answers = [m for m in chat if m.get("metadata", {}).get("parent_id") == "call-0"]
    assert [a["metadata"]["title"] for a in answers] == ["rehearsed response", "real response"]
    assert answers[0]["content"].startswith("status **ok** · shown to the agent")
    assert '"deleted": "work"' in answers[0]["content"]
    assert (
        answers[1]["content"].startswith("status **ok**\n") and '"saved"' in answers[1]["content"]
    )


def test_arguments_markdown_edge_cases():
    assert inspector.arguments_markdown("{}") == "**arguments:** none"
    assert inspector.arguments_markdown(None) == "**arguments:** none"
    assert "(not JSON)" in inspector.arguments_markdown("{oops")
    assert r"`\"a\|b\"`" not in inspector.arguments_markdown('{"k": "a|b"}')
    assert r'`"a\|b"`' in inspector.arguments_markdown('{"k": "a|b"}')  # the table holds


def test_clean_text_strips_template_and_call_tags():
    text = "<|im_start|>assistant\nHi<tool_call>{}</tool_call><|im_end|>"
    assert inspector.clean_text(text) == "Hi{}"
    assert inspector.clean_text(text, drop_calls=True) == "Hi"
    llama = "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
    assert inspector.clean_text(llama) == "hello"


def spans(tokens: str) -> list[tuple[str, str]]:
    """(title, text) of every token element of the token view (not the legend)."""
    body = tokens.split('class="envtok-body"', 1)[1]
    found = re.findall(
        r'<span class="tok [a-z]{2}" data-role="[a-z_]+" title="([^"]*)">([^<]*)<', body
    )
    return [(html.unescape(t), html.unescape(x)) for t, x in found]


def test_each_token_says_its_logprob_and_advantage_on_hover(ctx):
    _, _, tokens, _ = opened(ctx)
    found = spans(tokens)
    assert len(found) == 15 + 2  # the context's tokens and both rehearsals'
    first_act = found[3]
    assert first_act[0].startswith("token 4")
    assert "role act: act (trained)" in first_act[0]
    assert "log-prob -0.500 (p = 0.607)" in first_act[0]
    assert "advantage (act) +0.123" in first_act[0]
    prompt = found[0][0]
    assert "log-prob: none" in prompt and "advantage" not in prompt
    assert found[-1][0].splitlines()[-1] == "advantage (rehearse) -0.250"
    assert found[0][1] == "⟨1⟩"  # no tokenizer for this run here: the id stands in
    assert "tokens show their ids" in tokens


def test_a_tokenizer_gives_each_token_its_text(ctx):
    view = ctx.store.episode("notes-0", "notes")
    tokens = inspector.token_html(view, lambda ids: [f"w{i}" for i in ids])
    found = spans(tokens)
    assert found[3] == (found[3][0], "w4") and found[3][0].startswith('token 4 "w4"')
    assert "tokens show their ids" not in tokens


def test_the_runs_tokenizer_is_found_in_its_folder(ctx):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(30)} | {"[UNK]": 30}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    folder = ctx.store.run("notes").path
    tok.save(str(folder / "tokenizer.json"))
    assert inspector.tokenizer_file(ctx, "notes") == (folder / "tokenizer.json", "elsewhere/none")
    _, _, tokens, _ = opened(ctx)
    assert [text for _, text in spans(tokens)][:4] == ["w1", "w2", "w3", "w4"]


def test_the_token_view_stops_at_its_limit(ctx, monkeypatch):
    monkeypatch.setattr(inspector, "TOKEN_LIMIT", 5)
    view = ctx.store.episode("notes-0", "notes")
    tokens = inspector.token_html(view)
    assert len(spans(tokens)) == 5 and "12 more token(s) not drawn" in tokens


def test_episode_numbers_have_three_decimals(ctx):
    _, head, _, _ = opened(ctx)
    assert "| 0.333 | done |" in head and "+0.123" in head
    df, _, _ = inspector.episode_list(ctx, "notes", "", "", "", 1)
    assert df["reward"].tolist() == [0.333]


@pytest.mark.parametrize(
    ("asked", "shown", "note"),
    [
        (1, 1, ""),
        (3, 3, ""),
        (999, 3, "there is no page 999** (pages 1 to 3): showing 3"),
        (0, 1, "there is no page 0** (pages 1 to 3): showing 1"),
        (-4, 1, "there is no page -4"),
        (None, 1, ""),
        (float("nan"), 1, ""),
        ("abc", 1, "'abc' is not a page number"),
    ],
)
def test_the_episode_pager_clamps_and_says_so(ctx, asked, shown, note):
    df, pager, page = inspector.episode_list(ctx, "train-demo", "", "", "", asked)
    assert page == shown and pager.startswith(f"120 episode(s) · page {shown} of 3")
    assert note in pager and (bool(note) == ("**" in pager))
    assert len(df) == (20 if shown == 3 else 50)


def test_the_pairs_pager_clamps_and_says_so(ctx):
    df, pager, page = compare.pairs_table(ctx, "train-demo", "", "", 0, 1, 999)
    assert page == 5 and pager.startswith("240 pair(s) · page 5 of 5 · **there is no page 999")
    assert len(df) == 40
    df, pager, page = compare.pairs_table(ctx, "train-demo", "", "", 0, 1, 0)
    assert page == 1 and len(df) == 50 and "there is no page 0" in pager
    df, pager, page = compare.pairs_table(ctx, None, "", "", 0, 1, 1)
    assert df.empty and "Pick a run" in pager


def test_a_demo_run_decodes_with_its_studys_base_model_tokenizer_and_says_so(tmp_path):
    from envace_engine.models import SMOLLM2, cache_dir
    from storage import Store
    from studio.demo import install

    if not (cache_dir() / SMOLLM2 / "tokenizer.json").is_file():
        pytest.skip("the SmolLM2 tokenizer is not installed here")
    install(tmp_path)

    class Demo:
        root = tmp_path
        store = Store(tmp_path, url="duckdb:///:memory:")

    decode, model, stand_in = inspector.token_decoder(Demo(), "study-toy--envace")  # type: ignore[arg-type]
    assert decode is not None and stand_in == SMOLLM2 and model == "runs/runs/study-sft/model"
    assert decode([1]) == ["<|im_start|>"]
    view = Demo.store.episode("s37r0-3-1", "study-toy--envace")
    assert "decoded with <code>smollm2-135m</code>'s tokenizer" in inspector.token_html(
        view, decode, model, stand_in
    )
    Demo.store.close()
