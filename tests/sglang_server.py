"""A loopback server that speaks SGLang's native HTTP protocol, for end-to-end sampler tests.

It is a real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, a background
thread) backed by a real model through ``HFSampler``. It follows the stub checklist of
docs/protocols.md §1.6: single request → object, batch → list; ``output_ids`` include the stop token
while ``text`` drops it; ``meta_info`` with ``id``, ``finish_reason`` objects, token counts,
``cached_tokens``, ``weight_version`` and ``[logprob, id, null]`` triples; 400 with a string
``error`` on unknown ``sampling_params`` keys; prefix-matching ``/abort_request`` that turns
in-flight requests into HTTP 200 ``abort`` finishes; ``/update_weights_from_disk`` reloading a
checkpoint in place.

Fault injection (``server.faults``), each counting down per ``/generate`` request: ``status_503``
(answer 503 queue-full), ``delay`` (sleep ``delay_s`` first, abortable), ``malformed`` (a 200
with a broken JSON body) and ``abort`` (finish with ``abort`` after half the tokens); and per
``/update_weights_from_disk`` request: ``hide_weights`` (fail as if ``model_path`` did not exist
on the server, as when the trainer writes to a disk the server does not share).

``server.weight_versions`` records the weight version that answered each ``/generate`` request,
so a test can check which weights produced which rollout.

LoRA (``enable_lora=True``, as ``--enable-lora``): ``/load_lora_adapter`` and
``/unload_lora_adapter`` with SGLang's checks (a name and a path, no name loaded twice, an
adapter directory, rank within ``max_lora_rank`` and target modules within
``lora_target_modules``, as the server's flags); ``/generate`` answers each prompt from the
base model with its ``lora_path`` adapter merged in, and refuses an adapter that is not loaded.
``server.lora_paths`` records the adapter names each ``/generate`` request carried.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from envace_engine import adapters
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.embedded.sampler import HFSampler

# the exact sampling_params key set SGLang's contract accepts (docs/protocols.md §1.1)
_SAMPLING_KEY_NAMES = """
max_new_tokens temperature top_p top_k min_p frequency_penalty presence_penalty repetition_penalty
min_new_tokens stop stop_token_ids stop_regex ignore_eos skip_special_tokens no_stop_trim n
spaces_between_special_tokens json_schema regex ebnf structural_tag logit_bias sampling_seed
stream_interval custom_params
"""
SAMPLING_KEYS = frozenset(_SAMPLING_KEY_NAMES.split())


class BadRequest(Exception):
    """A 400 answer: ``body`` is the JSON the server sends back."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.body = body


@dataclass
class Faults:
    """Injected failures for the next N ``/generate`` requests (set from the test)."""

    status_503: int = 0
    delay: int = 0
    delay_s: float = 0.0
    malformed: int = 0
    abort: int = 0
    hide_weights: int = 0  # per /update_weights_from_disk request
    unhealthy: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, name: str) -> bool:
        """Consume one count of fault ``name``; whether it fires for this request."""
        with self.lock:
            left = getattr(self, name)
            if left > 0:
                setattr(self, name, left - 1)
            return left > 0


def adapters_targets() -> tuple[str, ...]:
    """Every linear layer of a Llama block (``--lora-target-modules all`` minus the LM head)."""
    from envace_engine.config import LORA_TARGETS

    return LORA_TARGETS


class LoopbackSGLang:
    """The server state: model, in-flight rids, request log, faults. ``url`` once started."""

    def __init__(
        self,
        model_path: Path,
        *,
        batch_size: int = 32,
        enable_lora: bool = False,
        max_lora_rank: int = 64,
        lora_target_modules: tuple[str, ...] = adapters_targets(),
    ) -> None:
        self.model_path = Path(model_path)
        self.batch_size = batch_size
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.lora_target_modules = frozenset(lora_target_modules)
        self.loras: dict[str, HFSampler] = {}  # loaded adapters, merged onto the base
        self.lora_paths: list[list[str | None]] = []  # the adapters each /generate named
        model = AutoModelForCausalLM.from_pretrained(self.model_path).eval()
        self.sampler = HFSampler(
            model, AutoTokenizer.from_pretrained(self.model_path), batch_size=batch_size
        )
        self.faults = Faults()
        self.weight_version = "default"
        self.requests: list[dict[str, Any]] = []  # every /generate body received
        self.aborts: list[str] = []  # every rid passed to /abort_request
        self.weight_versions: list[str] = []  # the version that answered each /generate
        self._inflight: dict[str, bool] = {}  # rid -> aborted?
        self._seen: list[
            tuple[int, ...]
        ] = []  # prompt + output of finished requests (radix stand-in)
        self._lock = (
            threading.Lock()
        )  # one "scheduler": generations and weight loads do not overlap
        self._state = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self.url = ""

    def start(self) -> str:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread; return the base URL."""
        handler = type("Handler", (_Handler,), {"state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return self.url

    def stop(self) -> None:
        """Shut the server down and close its socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # --- /generate -------------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> Any:
        """Answer a ``/generate`` body (raises ``BadRequest`` for a 400)."""
        single, prompts, params, rids = self._parse(body)
        names = self._lora_names(body.get("lora_path"), len(prompts))
        with self._state:
            duplicate = [r for r in rids if r in self._inflight]
            if duplicate:
                raise BadRequest(
                    {"error": {"message": f"Duplicate request ID detected: {duplicate[0]}"}}
                )
            self._inflight.update(dict.fromkeys(rids, False))
        try:
            if self.faults.take("delay"):
                self._sleep_unless_aborted(rids, self.faults.delay_s)
            gens = self._run(prompts, params, rids, names)
            inject_abort = self.faults.take("abort")
            with self._state:
                aborted = [self._inflight[r] or inject_abort for r in rids]
        finally:
            with self._state:
                for r in rids:
                    self._inflight.pop(r, None)
        items = [
            self._item(p, sp, g, rid, ab, body.get("return_logprob", False))
            for p, sp, g, rid, ab in zip(prompts, params, gens, rids, aborted, strict=True)
        ]
        return items[0] if single else items

    def _parse(
        self, body: dict[str, Any]
    ) -> tuple[bool, list[list[int]], list[SamplingParams], list[str]]:
        ids = body.get("input_ids")
        if ids is None:
            raise BadRequest(
                {"error": "Either text, input_ids or input_embeds should be provided."}
            )
        single = not ids or isinstance(ids[0], int)
        prompts = [ids] if single else ids
        if any(len(p) == 0 for p in prompts):
            raise BadRequest({"error": {"message": "input_ids cannot be empty."}})
        raw = body.get("sampling_params") or {}
        raw_list = raw if isinstance(raw, list) else [raw] * len(prompts)
        if len(raw_list) != len(prompts):
            raise BadRequest({"error": "sampling_params list does not match the batch size"})
        params = [_to_params(r) for r in raw_list]
        context = self.sampler.model.config.max_position_embeddings
        for prompt, p in zip(prompts, params, strict=True):
            if len(prompt) + p.max_new_tokens > context:
                total = len(prompt) + p.max_new_tokens
                message = (
                    "Requested token count exceeds the model's maximum context length of "
                    f"{context} tokens. You requested a total of {total} tokens: {len(prompt)} "
                    f"tokens from the input messages and {p.max_new_tokens} tokens for the "
                    "completion."
                )
                raise BadRequest({"error": {"message": message}})
        rid = body.get("rid")
        if rid is None:
            rids = [uuid.uuid4().hex for _ in prompts]
        elif isinstance(rid, str):
            rids = [rid] if single else [f"{rid}_{i}" for i in range(len(prompts))]
        else:
            rids = list(rid)
        return single, prompts, params, rids

    def _sleep_unless_aborted(self, rids: list[str], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self._state:
                if all(self._inflight.get(r) for r in rids):
                    return
            time.sleep(0.01)

    def _lora_names(self, raw: Any, n: int) -> list[str | None]:
        """Each prompt's adapter (``lora_path``: one name, or one per prompt); 400 when LoRA is
        off or a name is not loaded, as SGLang answers."""
        names = list(raw) if isinstance(raw, list) else [raw] * n
        if len(names) != n:
            raise BadRequest({"error": {"message": "lora_path list does not match the batch"}})
        asked = {x for x in names if x is not None}
        if asked and not self.enable_lora:
            message = "LoRA is not enabled. Please set `--enable-lora` to True."
            raise BadRequest({"error": {"message": message}})
        missing = sorted(asked - set(self.loras))
        if missing:
            message = (
                f"The following requested LoRA adapters are not loaded: {missing}\n"
                f"Loaded adapters: {sorted(self.loras)}."
            )
            raise BadRequest({"error": {"message": message}})
        self.lora_paths.append(names)
        return names

    def _run(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        rids: list[str],
        names: list[str | None],
    ) -> list[Generation]:
        """Generate with HFSampler, one call per distinct sampling setting and adapter (like one
        scheduler)."""
        out: dict[int, Generation] = {}
        with self._lock:  # a weight load takes this lock too: the version holds for the request
            self.weight_versions.append(self.weight_version)
            groups: dict[tuple[SamplingParams, str | None], list[int]] = {}
            for i, (p, name) in enumerate(zip(params, names, strict=True)):
                groups.setdefault((p, name), []).append(i)
            for (p, name), idx in groups.items():
                with self._state:
                    live = [i for i in idx if not self._inflight[rids[i]]]
                sampler = self.sampler if name is None else self.loras[name]
                gens = sampler.generate([prompts[i] for i in live], p) if live else []
                out.update(zip(live, gens, strict=True))
        empty = Generation((), (), "abort")
        return [out.get(i, empty) for i in range(len(prompts))]

    def _item(
        self,
        prompt: list[int],
        params: SamplingParams,
        gen: Generation,
        rid: str,
        aborted: bool,
        logprob: bool,
    ) -> dict[str, Any]:
        ids, lps = list(gen.token_ids), list(gen.logprobs)
        if aborted:
            ids, lps = ids[: len(ids) // 2], lps[: len(lps) // 2]
            finish: dict[str, Any] = {"type": "abort", "message": "Abort in waiting queue"}
        elif gen.finish_reason == "stop":
            finish = {"type": "stop", "matched": ids[-1]}
        else:
            finish = {"type": "length", "length": params.max_new_tokens}
        text = (
            gen.text
            if not aborted
            else self.sampler.tokenizer.decode(ids, skip_special_tokens=True)
        )
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "cached_tokens": self._cached(prompt),
            "weight_version": self.weight_version,
            "e2e_latency": 0.0,
        }
        if logprob:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
        with self._state:
            self._seen = [*self._seen[-255:], tuple(prompt + ids)]
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _cached(self, prompt: list[int]) -> int:
        """Longest prefix shared with an earlier sequence, capped at ``len(prompt) - 1``."""
        best = 0
        with self._state:
            seen = list(self._seen)
        for seq in seen:
            n = 0
            while n < min(len(seq), len(prompt) - 1) and seq[n] == prompt[n]:
                n += 1
            best = max(best, n)
        return best

    # --- other endpoints -------------------------------------------------------------------

    def abort(self, rid: str, abort_all: bool) -> None:
        """Mark every in-flight rid starting with ``rid`` (or all) as aborted."""
        with self._state:
            self.aborts.append(rid)
            for r in self._inflight:
                if abort_all or r.startswith(rid):
                    self._inflight[r] = True

    def update_weights(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Load the checkpoint at ``model_path`` into the served model, in place."""
        path = Path(str(body.get("model_path", "")))
        if self.faults.take("hide_weights") or not (path / "config.json").is_file():
            message = (
                f"Failed to load weights: {path} is not a checkpoint directory (no config.json)"
            )
            return 400, {"success": False, "message": message, "num_paused_requests": 0}
        fresh = AutoModelForCausalLM.from_pretrained(path)
        with self._lock:
            self.sampler.model.load_state_dict(fresh.state_dict())
            self.model_path = path
            if body.get("weight_version"):
                self.weight_version = str(body["weight_version"])
            with self._state:
                self._seen.clear()  # flush_cache defaults to true
        return 200, {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        }

    def load_lora(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``/load_lora_adapter``: check as SGLang does, then serve base + adapter as the name."""
        name, path = str(body.get("lora_name") or ""), Path(str(body.get("lora_path") or ""))
        error = self._lora_refusal(name, path)
        if error:
            return 400, {"success": False, "error_message": error, "loaded_adapters": None}
        base = AutoModelForCausalLM.from_pretrained(self.model_path)
        base.load_state_dict(self.sampler.model.state_dict())  # the weights served now
        merged = adapters.merged(base, path)
        with self._lock:
            self.loras[name] = HFSampler(merged, self.sampler.tokenizer, batch_size=self.batch_size)
        loaded = {n: str(n) for n in self.loras}
        return 200, {"success": True, "error_message": None, "loaded_adapters": loaded}

    def _lora_refusal(self, name: str, path: Path) -> str:
        """Why SGLang would refuse to load adapter ``path`` as ``name`` ('' when it loads)."""
        if not self.enable_lora:
            return "LoRA is not enabled. Please set `--enable-lora` to True."
        if not name or not str(path):
            return "lora_name and lora_path are required"
        if name in self.loras:
            return f"Failed to load LoRA adapter {name}: the name is already loaded"
        if not adapters.is_adapter_dir(path):
            return f"Failed to load LoRA adapter {name}: no adapter_config.json under {path}"
        config = adapters.adapter_config(path)
        if int(config.get("r", 0)) > self.max_lora_rank:
            return (
                f"LoRA adapter {name} has rank {config.get('r')}, larger than --max-lora-rank "
                f"{self.max_lora_rank}"
            )
        extra = set(config.get("target_modules") or ()) - self.lora_target_modules
        if extra:
            return f"LoRA adapter {name} targets {sorted(extra)}, not in --lora-target-modules"
        return ""

    def unload_lora(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """``/unload_lora_adapter``."""
        name = str(body.get("lora_name") or "")
        with self._lock:
            if name not in self.loras:
                message = f"LoRA adapter {name!r} is not loaded"
                return 400, {"success": False, "error_message": message, "loaded_adapters": None}
            del self.loras[name]
        loaded = {n: str(n) for n in self.loras}
        return 200, {"success": True, "error_message": None, "loaded_adapters": loaded}

    def model_info(self) -> dict[str, Any]:
        """The ``/model_info`` body."""
        return {
            "model_path": str(self.model_path),
            "served_model_name": str(self.model_path),
            "tokenizer_path": str(self.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }


def _to_params(raw: dict[str, Any]) -> SamplingParams:
    unknown = [k for k in raw if k not in SAMPLING_KEYS]
    if unknown:
        expected = ", ".join(f"`{k}`" for k in sorted(SAMPLING_KEYS))
        raise BadRequest({"error": f"unknown field `{unknown[0]}`, expected one of {expected}"})
    top_k = int(raw.get("top_k", -1))
    return SamplingParams(
        max_new_tokens=int(raw.get("max_new_tokens", 128)),
        temperature=float(raw.get("temperature", 1.0)),
        top_p=float(raw.get("top_p", 1.0)),
        top_k=-1 if top_k >= 1 << 30 else top_k,
        stop_token_ids=tuple(raw.get("stop_token_ids") or ()),
        seed=raw.get("sampling_seed"),
    )


class _Handler(BaseHTTPRequestHandler):
    state: LoopbackSGLang
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""

    def do_GET(self) -> None:
        """``/health``, ``/model_info``, ``/flush_cache``."""
        path = self.path.split("?")[0]
        if path in ("/health", "/health_generate", "/ready"):
            self._send(503 if self.state.faults.unhealthy else 200, b"")
        elif path in ("/model_info", "/get_model_info"):
            self._json(200, self.state.model_info())
        elif path == "/flush_cache":
            self._flush()
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """``/generate``, ``/abort_request``, ``/update_weights_from_disk``, ``/flush_cache``."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._json(
                400, {"object": "error", "message": str(exc), "type": "Bad Request", "code": 400}
            )
            return
        path = self.path.split("?")[0]
        if path == "/generate":
            self._generate(body)
        elif path == "/abort_request":
            self.state.abort(str(body.get("rid", "")), bool(body.get("abort_all", False)))
            self._send(200, b"")
        elif path == "/update_weights_from_disk":
            self._json(*self.state.update_weights(body))
        elif path == "/load_lora_adapter":
            self._json(*self.state.load_lora(body))
        elif path == "/unload_lora_adapter":
            self._json(*self.state.unload_lora(body))
        elif path == "/flush_cache":
            self._flush()
        else:
            self._json(404, {"detail": "Not Found"})

    def _generate(self, body: dict[str, Any]) -> None:
        self.state.requests.append(body)
        faults = self.state.faults
        if faults.take("status_503"):
            message = {
                "object": "error",
                "message": "The request queue is full.",
                "type": "503",
                "param": None,
                "code": 503,
            }
            self._json(503, message)
            return
        try:
            answer = self.state.generate(body)
        except BadRequest as exc:
            self._json(400, exc.body)
            return
        if faults.take("malformed"):
            self._send(200, b'{"text": "half a respon', "application/json")
            return
        self._json(200, answer)

    def _flush(self) -> None:
        with self.state._state:
            self.state._seen.clear()
        self._send(200, b"Cache flushed.\n", "text/plain")

    def _json(self, status: int, body: Any) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str = "text/plain") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left; SGLang also just drops the answer


@contextmanager
def running_server(model_path: Path, **kwargs: Any) -> Iterator[LoopbackSGLang]:
    """Start a loopback SGLang server on the checkpoint; stop it on exit (use as a fixture body)."""
    server = LoopbackSGLang(model_path, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()
