"""Tool-call and rehearsal-output parsers: accepted forms, error codes, and never raising."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envace_engine.rollout import parsing
from envace_engine.rollout.parsing import parse_rehearsal, parse_tool_calls, sanitize
from envace_engine.types import ToolCall


def test_one_tagged_call():
    reply = parse_tool_calls(
        'Sure.\n<tool_call>\n{"name": "get", "arguments": {"key": "a"}}\n</tool_call>'
    )
    assert reply.ok and not reply.is_final
    assert [(c.name, c.arguments) for c in reply.calls] == [("get", {"key": "a"})]
    assert reply.content == "Sure."


def test_several_calls_in_one_reply_keep_their_order():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>'
        '<tool_call>[{"name": "c"}, {"name": "d", "arguments": "{\\"z\\": 3}"}]</tool_call>'
    )
    reply = parse_tool_calls(text)
    assert reply.ok
    assert [(c.name, c.arguments) for c in reply.calls] == [
        ("a", {"x": 1}),
        ("b", {"y": 2}),
        ("c", {}),
        ("d", {"z": 3}),
    ]


def test_tolerant_variants():
    fenced = '<tool_call>\n```json\n{"name": "f", "arguments": {}}\n```\n</tool_call>'
    unclosed = 'ok <tool_call>{"name": "f", "arguments": {"k": [1]}}'
    trailing = '<tool_call>{"name": "f", "arguments": {}} extra</tool_call>'
    openai = '<tool_call>{"type": "function", "function": {"name": "f", "arguments": "{}"}}'
    other_tag = '<function_call>{"name": "f", "arguments": {}}</function_call>'
    bare = '```json\n{"name": "f", "arguments": {"k": 1}}\n```'
    for text in (fenced, unclosed, trailing, openai, other_tag, bare):
        reply = parse_tool_calls(text)
        assert reply.ok, (text, reply.errors)
        assert [c.name for c in reply.calls] == ["f"], text


def test_plain_text_is_a_final_answer():
    for text in ("The answer is 42.", '{"answer": 42}', "", "Use <tool_call> tags? no."):
        reply = parse_tool_calls(text)
        if "<tool_call>" in text:
            continue
        assert reply.is_final, text
        assert reply.content == text.strip()


def _codes(text: str) -> list[str]:
    return [e.code for e in parse_tool_calls(text).errors]


def test_error_codes():
    assert _codes("<tool_call></tool_call>") == [parsing.EMPTY_TOOL_CALL]
    assert _codes("<tool_call>[]</tool_call>") == [parsing.EMPTY_TOOL_CALL]
    assert _codes("<tool_call>{nope}</tool_call>") == [parsing.INVALID_JSON]
    assert _codes("<tool_call>[1, 2]</tool_call>") == [parsing.NOT_AN_OBJECT] * 2
    assert _codes('<tool_call>{"arguments": {}}</tool_call>') == [parsing.MISSING_NAME]
    assert _codes('<tool_call>{"name": "  "}</tool_call>') == [parsing.MISSING_NAME]
    assert _codes('<tool_call>{"name": 3}</tool_call>') == [parsing.MISSING_NAME]
    assert _codes('<tool_call>{"name": "f", "arguments": [1]}</tool_call>') == [
        parsing.INVALID_ARGUMENTS
    ]
    assert _codes('<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>') == [
        parsing.INVALID_ARGUMENTS
    ]
    assert _codes('<tool_call>{"name": "f", "argu') == [parsing.UNCLOSED_TOOL_CALL]
    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"
    assert _codes(deep) == [parsing.JSON_TOO_DEEP]


def test_errors_keep_the_offending_text_short():
    error = parse_tool_calls("<tool_call>" + "x" * 5000 + "</tool_call>").errors[0]
    assert error.code == parsing.INVALID_JSON
    assert error.text.startswith("xxx") and len(error.text) <= 200
    assert "valid JSON" in error.message


def test_valid_call_beside_a_broken_one_reports_both():
    reply = parse_tool_calls('<tool_call>{"name": "a"}</tool_call><tool_call>{oops}</tool_call>')
    assert [c.name for c in reply.calls] == ["a"]
    assert [e.code for e in reply.errors] == [parsing.INVALID_JSON]
    assert not reply.ok and not reply.is_final


def test_lone_surrogates_are_replaced_everywhere():
    assert sanitize("a\ud800b") == "a\ufffdb"
    reply = parse_tool_calls('<tool_call>{"name": "f\ud83d", "arguments": {"k": "\\udc00"}}')
    call = reply.calls[0]
    assert call.name == "f\ufffd" and call.arguments == {"k": "\ufffd"}
    json.dumps(call.arguments).encode("utf-8")
    result = parse_rehearsal('<execution_result>{"\\ud800": "x"}</execution_result>').result
    assert result is not None and result.value == {"\ufffd": "x"}


def test_rehearsal_values_and_errors():
    ok = parse_rehearsal('thinking...<execution_result>{"files": ["a.txt"]}</execution_result>')
    assert ok.error is None and ok.result is not None
    assert ok.result.value == {"files": ["a.txt"]} and ok.result.ok
    scalar = parse_rehearsal("<execution_result> 7 </execution_result>")
    assert scalar.result is not None and scalar.result.value == 7
    unclosed = parse_rehearsal('<execution_result>{"a": 1}')
    assert unclosed.result is not None and unclosed.result.value == {"a": 1}
    flagged = parse_rehearsal(
        '<execution_result>{"error": {"code": "TOOL_NOT_AVAILABLE", "message": "no rm"}}'
        "</execution_result>"
    )
    assert flagged.result is not None and flagged.result.error is not None
    assert flagged.result.error.code == parsing.TOOL_NOT_AVAILABLE
    assert flagged.result.error.message == "no rm"
    short = parse_rehearsal('<execution_result>{"error": "INVALID_PARAMETERS"}</execution_result>')
    assert short.result is not None and short.result.error is not None
    assert short.result.error.code == parsing.INVALID_PARAMETERS
    prose = parse_rehearsal('<execution_result>{"error": "file not found"}</execution_result>')
    assert prose.result is not None and prose.result.error is not None
    assert prose.result.error.code == parsing.TOOL_EXECUTION_ERROR
    assert prose.result.error.message == "file not found"


def test_rehearsal_error_codes():
    assert parse_rehearsal("the file exists").error.code == parsing.MISSING_EXECUTION_RESULT
    empty = parse_rehearsal("<execution_result>  </execution_result>")
    assert empty.error.code == parsing.EMPTY_EXECUTION_RESULT
    bad = parse_rehearsal("<execution_result>{x: }</execution_result>")
    assert bad.error.code == parsing.INVALID_JSON and bad.result is None


def test_result_json_round_trip():
    for value in ({"a": [1, 2]}, 3, "text", None, {"error": {"code": "X", "message": "m"}}):
        assert parsing.result_to_json(parsing.result_from_json(value)) == value


FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<function_call>",
        "<execution_result>",
        "</execution_result>",
        "```json\n",
        "```",
        '{"name": "f", ',
        '"arguments": ',
        '"parameters": ',
        "{",
        "}",
        "[",
        "]",
        '"',
        ",",
        '{"error": ',
        "\\ud800",
        "\ud800",
        "null",
        "1e999",
        '"\\u0000"',
    ]
)
MODEL_TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.text() | MODEL_TEXT)
def test_no_string_makes_the_call_parser_raise(text):
    reply = parse_tool_calls(text)
    for call in reply.calls:
        assert isinstance(call, ToolCall) and isinstance(call.arguments, dict)
        json.dumps({"name": call.name, "arguments": call.arguments}).encode("utf-8")
    for error in reply.errors:
        assert error.code and error.message
    reply.content.encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(st.text() | MODEL_TEXT)
def test_no_string_makes_the_rehearsal_parser_raise(text):
    parsed = parse_rehearsal(text)
    assert (parsed.result is None) != (parsed.error is None)
    if parsed.result is not None:
        json.dumps(parsing.result_to_json(parsed.result)).encode("utf-8")
