"""Text similarities of a step's (rehearsed, real) pairs in a helper process, on another core.

Why. Writing a step is Python work that holds the GIL (building Arrow columns from the
episodes' objects, canonical JSON, the fidelity tiers), except the Parquet encoding, which a
worker thread does on the second core. The tiers' costliest part, the text similarity of each
inexact pair (``fidelity.metrics.similarities``), needs nothing but the two canonical JSON
texts, so it can run in another process while the writer builds the segments and rehearsals
shards: in ``bench/storage.py`` it is a large share of the writer's Python time.

``SimilarityHelper.submit`` sends a step's text pairs to one helper process
(``python -m envace_engine.fidelity.worker``) and returns a function that waits for the
answer. Small steps (under ``MIN_PAIRS`` distinct pairs) are computed in the calling process:
shipping them costs more than it saves. The helper is started at the first large step and used
from the first step that finds it ready (its start is not waited for). If it cannot be started,
dies or answers garbage, that step is computed here and, after ``MAX_FAILURES`` such failures,
the helper is no longer used. The numbers are the same either way: the helper runs the same
function on the same strings.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import subprocess
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import envace_engine
from envace_engine.fidelity.metrics import similarities
from envace_engine.fidelity.worker import READY, receive, send

MIN_PAIRS = 2000  # distinct text pairs in a step below which the helper is not worth it
MAX_FAILURES = 3  # helper failures after which a writer stops using one
COMMAND = (sys.executable, "-m", "envace_engine.fidelity.worker")


def _child_env() -> dict[str, str]:
    """This environment, with the folder this process imported ``envace_engine`` from first on
    the helper's path: it runs the same code even when that folder is not installed."""
    root = str(Path(envace_engine.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else os.pathsep.join((root, path))}


_LIVE: weakref.WeakSet[SimilarityHelper] = weakref.WeakSet()  # helpers with a process


def _drop_helpers_in_child() -> None:
    """After a fork, the child closes its copies of the helpers' pipes (and never waits for them):
    otherwise a helper would only see end-of-input once every forked child had exited too."""
    for helper in list(_LIVE):
        helper._forget()


os.register_at_fork(after_in_child=_drop_helpers_in_child)


class SimilarityHelper:
    """One helper process computing ``similarities`` for a ``RunWriter`` (see module doc)."""

    def __init__(self, min_pairs: int = MIN_PAIRS) -> None:
        self.min_pairs = min_pairs
        self.failures = 0
        self.used = 0  # steps the helper answered (tests, diagnostics)
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._pending = False  # a request whose answer was not read (the step failed)

    def submit(self, texts: list[tuple[str, str]]) -> Callable[[], Sequence[float]]:
        """Start computing the similarity of each text pair; calling the returned function
        gives them (computed here when the helper is not ready)."""
        here = functools.partial(similarities, texts)
        if len(texts) < self.min_pairs or not self._up():
            return here
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        stdout = proc.stdout
        try:
            if self._pending:  # the last step failed before reading its answer: drop it
                receive(proc.stdout)
            send(proc.stdin, texts)
        except (OSError, EOFError, ValueError):
            self._lost()
            return here
        self._pending = True

        def answer() -> Sequence[float]:
            try:
                values = receive(stdout)
            except Exception:  # died, or garbage: this step is computed here
                self._lost()
                return here()
            self._pending = False
            if not isinstance(values, list) or len(values) != len(texts):
                self._lost()
                return here()
            self.used += 1
            return values

        return answer

    def _up(self) -> bool:
        """Whether the helper is ready; starts it (without waiting) when there is none."""
        if self.failures >= MAX_FAILURES:
            return False
        if self._proc is None:
            self._start()
            return False
        if not self._ready:
            stdout = self._proc.stdout
            assert stdout is not None
            if not select.select([stdout], [], [], 0)[0]:
                return False  # still importing
            if stdout.read(len(READY)) != READY:
                self._lost()
                return False
            self._ready = True
        return True

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env()
            )
        except OSError:
            self.failures += 1
            return
        _LIVE.add(self)

    def _forget(self) -> subprocess.Popen[bytes] | None:
        """Close this process's ends of the pipes (the helper sees end-of-input) and return the
        helper's process, no longer used here."""
        proc, self._proc, self._ready, self._pending = self._proc, None, False, False
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()  # type: ignore[union-attr]
        return proc

    def _lost(self) -> None:
        self.failures += 1
        self.close()

    def close(self) -> None:
        """Stop the helper (closing its stdin ends it); a later large step starts a new one."""
        proc = self._forget()
        if proc is None:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __del__(self) -> None:
        self.close()
