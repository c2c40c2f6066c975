"""Live rehearsal: a small persistent subprocess that loads a model once and rehearses on demand.

The studio never imports torch, so the model lives in ``python -m studio.rehearse_worker``: it
reads one JSON request per line on stdin and writes one JSON answer per line on stdout.

Request: ``{"model": NAME, "prompt_ids": [...], "max_new_tokens": N, "temperature": T,
"seed": S}`` — the rehearse prompt as token ids, exactly as the rollout built it (token in, token
out: nothing is re-rendered or re-tokenised). Answer: ``{"text", "result" (parsed JSON value or
null), "error" (parse error code or null), "tokens", "seconds", "load_s"}`` or
``{"error": message}`` when the request itself was bad.

``RehearseClient`` is the studio side: it starts the worker lazily on the first request, keeps it
for later ones (the model stays loaded) and restarts it if it died.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import IO, Any

MAX_NEW_TOKENS = 256


class RehearseError(RuntimeError):
    """The worker could not answer; the message says why."""


class RehearseClient:
    """Studio-side handle on the worker process (thread-safe: one request at a time)."""

    def __init__(self, timeout_s: float = 180.0) -> None:
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "studio.rehearse_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        return self._proc

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its answer (raises RehearseError on failure)."""
        with self._lock:
            proc = self._ensure()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = _read_line(proc.stdout, self.timeout_s)
            if line is None:
                self.close()
                raise RehearseError(f"the rehearse worker gave no answer in {self.timeout_s:.0f} s")
        answer = json.loads(line)
        if "text" not in answer:
            raise RehearseError(str(answer.get("error", "malformed worker answer")))
        return answer

    def close(self) -> None:
        """Stop the worker (its model is unloaded)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        self._proc = None


def _read_line(stream: IO[str], timeout_s: float) -> str | None:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0] if box and box[0] else None


class _Models:
    """Loaded models and samplers by name (worker side; imports torch lazily)."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    def sampler(self, name: str) -> tuple[Any, Any, float]:
        if name in self.loaded:
            sampler, tok = self.loaded[name]
            return sampler, tok, 0.0
        start = time.perf_counter()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from envace_engine.models import resolve
        from envace_engine.samplers.hf import HFSampler

        spec = resolve(name)
        if spec.kind != "hf":
            raise ValueError(f"live rehearsal runs an embedded model, not {spec.kind}: {name}")
        tok = AutoTokenizer.from_pretrained(spec.path)
        model = AutoModelForCausalLM.from_pretrained(spec.path).eval()
        sampler = HFSampler(model, tok, batch_size=1)
        self.loaded[name] = (sampler, tok)
        return sampler, tok, time.perf_counter() - start


def answer(models: _Models, request: dict[str, Any]) -> dict[str, Any]:
    """Rehearse one request (worker side)."""
    from envace_engine.parsing import parse_rehearsal
    from envace_engine.samplers.base import SamplingParams

    ids = request.get("prompt_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return {"error": "prompt_ids must be a non-empty list of token ids"}
    sampler, tok, load_s = models.sampler(str(request.get("model", "smollm2-135m")))
    params = SamplingParams(
        max_new_tokens=min(int(request.get("max_new_tokens", 128)), MAX_NEW_TOKENS),
        temperature=max(0.0, float(request.get("temperature", 0.0))),  # 0 = greedy
        seed=int(request.get("seed", 0)),
    )
    start = time.perf_counter()
    [gen] = sampler.generate([ids], params)
    seconds = time.perf_counter() - start
    text = tok.decode(list(gen.token_ids), skip_special_tokens=True)
    parsed = parse_rehearsal(text)
    result = parsed.result
    return {
        "text": text,
        "result": None if result is None or result.error else result.value,
        "result_error": None if result is None or not result.error else result.error.code,
        "error": parsed.error.code if parsed.error else None,
        "tokens": len(gen.token_ids),
        "seconds": round(seconds, 3),
        "load_s": round(load_s, 3),
        "finish_reason": gen.finish_reason,
    }


def serve() -> None:
    """Answer JSON lines from stdin until it closes."""
    models = _Models()
    for line in sys.stdin:
        try:
            reply = answer(models, json.loads(line))
        except (ValueError, RuntimeError, OSError) as err:  # a bad request, not a dead worker
            reply = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
