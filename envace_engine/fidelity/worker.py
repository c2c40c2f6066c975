"""A helper process computing ``fidelity.similarities`` for another process (``python -m``).

The protocol is framed pickles over stdin/stdout: the helper writes ``READY`` once it has
imported what it needs; then each request is a list of ``(text, text)`` pairs and each answer
the list of their similarities, every message an 8-byte little-endian length and the pickle.
It exits when its stdin closes (the parent finished or died). It imports only the fidelity
module, so it starts in a fraction of a second and never runs the parent's ``__main__`` (as a
``multiprocessing`` spawn would). ``storage.scoring`` is the parent side.
"""

from __future__ import annotations

import pickle
import struct
import sys
from typing import IO, Any

from envace_engine.fidelity.metrics import similarities

READY = b"R"
_LENGTH = struct.Struct("<Q")


def send(stream: IO[bytes], value: Any) -> None:
    """Write one framed pickle and flush it."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    """Read one framed pickle; EOFError when the stream ends (at or inside a message)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other process closed the pipe")
    (size,) = _LENGTH.unpack(head)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the other process closed the pipe inside a message")
    return pickle.loads(payload)  # our own parent process wrote it


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer similarity requests until ``requests`` ends."""
    answers.write(READY)
    answers.flush()
    while True:
        try:
            pairs = receive(requests)
        except EOFError:
            return
        send(answers, similarities(pairs))


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
