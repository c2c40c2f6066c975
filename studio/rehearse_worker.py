"""Live rehearsal: a small persistent subprocess that loads a model once and rehearses on demand.

The studio never imports torch, so the model lives in ``python -m studio.rehearse_worker``: it
reads one JSON request per line on stdin and writes one JSON answer per line on stdout.

Request: ``{"model": NAME, "prompt_ids": [...], "max_new_tokens": N, "temperature": T,
"seed": S}`` — the rehearse prompt as token ids, exactly as the rollout built it (token in, token
out: nothing is re-rendered or re-tokenised). ``model`` is required: the worker never picks one
itself, so an answer is never silently another model's. Answer: ``{"text", "result" (parsed JSON
value or null), "error" (parse error code or null), "tokens", "seconds", "load_s", "model" (the
name asked for), "model_path" (the folder it was loaded from)}`` or ``{"error": message}`` when
the request itself was bad.

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

from envace_engine.environments import get_suite
from envace_engine.models import resolve
from envace_engine.rollout.parsing import parse_rehearsal
from envace_engine.rollout.prompts import RehearseContext, assistant_text, rehearse_messages, render
from envace_engine.samplers.base import SamplingParams
from envace_engine.types import ToolCall

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
        self.paths: dict[str, str] = {}  # name -> the folder its weights came from

    def sampler(self, name: str) -> tuple[Any, Any, float]:
        if name in self.loaded:
            sampler, tok = self.loaded[name]
            return sampler, tok, 0.0
        start = time.perf_counter()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from envace_engine.samplers.embedded.sampler import HFSampler

        spec = resolve(name)
        if spec.kind != "hf":
            raise ValueError(f"live rehearsal runs an embedded model, not {spec.kind}: {name}")
        assert spec.path is not None  # resolve gives every hf spec its checkpoint dir
        tok = AutoTokenizer.from_pretrained(spec.path)
        model = AutoModelForCausalLM.from_pretrained(spec.path).eval()
        sampler = HFSampler(model, tok, batch_size=1)
        self.loaded[name] = (sampler, tok)
        self.paths[name] = str(spec.path)
        return sampler, tok, time.perf_counter() - start


def answer(models: _Models, request: dict[str, Any]) -> dict[str, Any]:
    """Rehearse one request (worker side): stored prompt ids, or a new call on a task."""
    if not isinstance(request.get("model"), str) or not request["model"].strip():
        return {"error": "name the model to rehearse with (model: a name or checkpoint folder)"}
    if request.get("kind") == "call":
        return answer_call(models, request)
    ids = request.get("prompt_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return {"error": "prompt_ids must be a non-empty list of token ids"}
    return _rehearse(models, request, ids)


def answer_call(models: _Models, request: dict[str, Any]) -> dict[str, Any]:
    """Rehearse a call the user wrote, on a task's initial state, and run it for real too.

    Request: ``{"kind": "call", "model", "suite", "split", "task_id", "call": {"name",
    "arguments"}, "grounded", ...sampling}``. The rehearse prompt is built by the same function
    the rollout uses (docs/method.md §2, no history: the call is the first of the episode); the real
    response comes from a fresh environment at the task's initial state.
    """

    suite = get_suite(str(request.get("suite", "toy")))
    tasks = {t.id: t for t in suite.tasks(str(request.get("split", "validation")))}
    task = tasks.get(str(request.get("task_id", "")))
    if task is None:
        return {"error": f"no task {request.get('task_id')!r} in that suite and split"}
    raw = request.get("call") or {}
    call = ToolCall(str(raw.get("name", "")), dict(raw.get("arguments") or {}))
    env = suite.make_env(task)
    ctx = RehearseContext(
        tools=tuple(env.tools()), task=task, grounded=bool(request.get("grounded", False))
    )
    messages = rehearse_messages(ctx, [], assistant_text([call]), call)
    _, tok, _ = models.sampler(str(request["model"]))
    text = render(tok, messages, add_generation_prompt=True)
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    reply = _rehearse(models, request, ids)
    real = env.execute(call)
    reply["real"] = (
        real.value
        if real.error is None  # real.ok
        else {"error": {"code": real.error.code, "message": real.error.message}}
    )
    reply["initial_state"] = task.initial_state
    reply["prompt_tokens"] = len(ids)
    return reply


def _rehearse(models: _Models, request: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    name = str(request["model"])
    sampler, tok, load_s = models.sampler(name)
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
        "model": name,  # which model answered: the page names it and warns if not the run's
        "model_path": models.paths.get(name, ""),
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
