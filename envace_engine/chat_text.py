"""Chat-template text as a reader wants it: the words of a turn without the markup a chat
template puts around them (ChatML and Llama 3 headers, special tokens, call and response tags).

Stored segments keep the template text the model saw (token-in/token-out); the studio's
inspector and the trackers' traces show the words, so both strip the same markup here.
"""

from __future__ import annotations

import re

TEMPLATE_TOKENS = re.compile(
    r"<\|im_start\|>[a-z_]*\n?"
    r"|<\|start_header_id\|>[^<]*<\|end_header_id\|>\n*"
    r"|<\|[a-z_]+\|>"
    r"|</?(?:tool_call|tool_response|function_call|tools)>"
    r"|</?s>"
)
CALL_BLOCKS = re.compile(r"<(tool_call|function_call)>.*?(?:</\1>|$)", re.S)


def clean_text(text: str | None, drop_calls: bool = False) -> str:
    """``text`` without chat-template markup; ``drop_calls`` also removes whole call blocks
    (where the calls are shown parsed beside the words)."""
    out = str(text or "")
    if drop_calls:
        out = CALL_BLOCKS.sub("", out)
    return TEMPLATE_TOKENS.sub("", out).strip()
