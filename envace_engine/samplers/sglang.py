"""``SGLangSampler``: token-in/token-out generation over SGLang's native HTTP API.

Protocol: docs/protocols.md §1. Each chunk of prompts is one ``POST /generate`` with a batch of
``input_ids``, ``return_logprob`` and one request id per sample (``{base}_{i}``), so a timed-out
batch can be cancelled with a single prefix ``/abort_request {"rid": "{base}_"}``.

Failure policy (docs/samplers.md): connection errors, read timeouts (after aborting the rids),
502, 503 and 504 are retried with exponential backoff, each retry on the next server URL with
fresh rids. Anything else (400, malformed JSON, a response that breaks the protocol) is not
retried. Server failures are never raised: the generation comes back with ``finish_reason``
``error`` (or ``abort`` when the server aborted the request) and the reason in ``error``, so the
rollout ends with a stored stop reason. Programmer errors (bad sampling params) still raise.

Continuous submission (``session``): each request is its own ``/generate`` call on a worker
thread, and SGLang's scheduler batches the requests in flight, so a rollout hands an episode's
next request over as soon as its last one finished instead of waiting for a micro-step's
slowest row.

This module needs only httpx: a GPU host's client does not need torch to drive a server.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.samplers.routing import PrefixRouter
from envace_engine.samplers.validation import check_request
from envace_engine.seeds import derive_seed

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({502, 503, 504})


class SamplerError(RuntimeError):
    """A sampler control call (weight update, health wait) failed; the message says where/why."""


class _FinishReason(BaseModel):
    type: str
    message: str | None = None


class _MetaInfo(BaseModel):
    id: str = ""
    finish_reason: _FinishReason | None = None
    output_token_logprobs: list[tuple[float | None, int, str | None]] | None = None


class _Item(BaseModel):
    """One element of a ``/generate`` response (extra keys are ignored)."""

    text: str = ""
    output_ids: list[int]
    meta_info: _MetaInfo


@dataclass(frozen=True)
class _Outcome:
    """The result of one HTTP attempt: generations, or an error and whether to retry it."""

    generations: list[Generation] | None = None
    error: str = ""
    retryable: bool = False


def _failed(message: str, n: int) -> list[Generation]:
    return [Generation((), (), "error", error=message) for _ in range(n)]


class SGLangSampler:
    """Batched sampling from one or more SGLang servers (or one router) (implements ``Sampler``)."""

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_batch: int = 64,
    ) -> None:
        self.urls = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("SGLangSampler needs at least one server URL (http://HOST:PORT)")
        self.urls = tuple(u.rstrip("/") for u in self.urls)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_batch = max_batch
        self.router = PrefixRouter(len(self.urls))
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._client = httpx.Client(timeout=timeout)
        self.generated = 0  # tokens generated so far (``TokenCounting``: progress shows tok/s)
        self._count_lock = threading.Lock()  # session jobs finish on pool threads
        self.lora_name: str | None = None  # the adapter every request names (``lora_path``)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order; failures come back as error/abort generations."""
        check_request(prompts, params)
        servers = self.router.assign(prompts)
        jobs: list[tuple[int, list[int]]] = []  # (server, prompt indices), at most max_batch each
        for server in range(len(self.urls)):
            mine = [i for i, s in enumerate(servers) if s == server]
            for start in range(0, len(mine), self.max_batch):
                jobs.append((server, mine[start : start + self.max_batch]))
        results: list[Generation | None] = [None] * len(prompts)
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), 32))) as pool:
            futures = [pool.submit(self._run_job, s, idx, prompts, params) for s, idx in jobs]
            for (_, idx), future in zip(jobs, futures, strict=True):
                for i, gen in zip(idx, future.result(), strict=True):
                    results[i] = gen
        missing = [i for i, g in enumerate(results) if g is None]
        if missing:  # every prompt is in exactly one job: this would be a routing bug
            raise RuntimeError(f"prompts {missing} were not sent to any server")
        return [g for g in results if g is not None]

    @contextlib.contextmanager
    def session(self, params: SamplingParams, max_inflight: int = 64) -> Iterator[SGLangSession]:
        """Continuous submission (``SGLangSession``): same interface as ``HFSampler.session``."""
        check_request([], params)
        with ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="sglang") as pool:
            yield SGLangSession(self, params, pool)

    def _run_job(
        self, server: int, indices: list[int], prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]:
        """Send one batch, retrying transient failures with backoff on the next URL."""
        batch = [prompts[i] for i in indices]
        body: dict[str, Any] = {
            "input_ids": batch,
            "sampling_params": sampling_params_json(params, indices),
            "return_logprob": True,
            "logprob_start_len": -1,
        }
        if self.lora_name is not None:  # SGLang's per-request adapter: one name per prompt
            body["lora_path"] = [self.lora_name] * len(batch)
        error = ""
        for attempt in range(self.max_retries + 1):
            target = (server + attempt) % len(self.urls)
            outcome = self._attempt(self.urls[target], body, len(batch))
            if outcome.generations is not None:
                for prompt, gen in zip(batch, outcome.generations, strict=True):
                    self.router.remember(prompt + list(gen.token_ids), target)
                with self._count_lock:
                    self.generated += sum(len(g.token_ids) for g in outcome.generations)
                return outcome.generations
            error = outcome.error
            if not outcome.retryable:
                break
            if attempt < self.max_retries:
                log.warning("SGLang attempt %d failed (%s); retrying", attempt + 1, error)
                time.sleep(self.backoff_s * 2**attempt)
        else:
            error = f"{error} (gave up after {self.max_retries + 1} attempts)"
        return _failed(error, len(batch))

    def _attempt(self, url: str, body: dict[str, Any], n: int) -> _Outcome:
        base = uuid.uuid4().hex
        request = {**body, "rid": [f"{base}_{i}" for i in range(n)]}
        try:
            resp = self._client.post(f"{url}/generate", json=request)
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            self._abort(url, f"{base}_")  # the server keeps generating otherwise
            return _Outcome(
                error=f"{url}: no answer within {self.timeout_s}s ({exc!r})", retryable=True
            )
        except httpx.TransportError as exc:
            return _Outcome(error=f"{url}: connection failed ({exc!r})", retryable=True)
        if resp.status_code in RETRY_STATUSES:
            return _Outcome(
                error=f"{url}: HTTP {resp.status_code} {resp.text[:200]}", retryable=True
            )
        if resp.status_code != 200:
            return _Outcome(error=f"{url}: HTTP {resp.status_code}: {_server_message(resp)}")
        try:
            payload = resp.json()
        except ValueError as exc:
            return _Outcome(error=f"{url}: malformed JSON in /generate response ({exc})")
        return parse_generate_response(payload, n, url)

    def _abort(self, url: str, rid_prefix: str) -> None:
        try:
            self._client.post(
                f"{url}/abort_request", json={"rid": rid_prefix}, timeout=self.connect_timeout_s
            )
        except httpx.HTTPError as exc:  # best effort: the server may be the thing that is down
            log.warning("could not abort %s on %s: %r", rid_prefix, url, exc)

    def health(self) -> dict[str, bool]:
        """``GET /health`` on every URL: whether each answers 200 (503 while SGLang loads)."""
        status = {}
        for url in self.urls:
            try:
                resp = self._client.get(f"{url}/health", timeout=self.connect_timeout_s)
                status[url] = resp.status_code == 200
            except httpx.HTTPError:
                status[url] = False
        return status

    def wait_until_healthy(self, timeout_s: float = 600.0, poll_s: float = 2.0) -> None:
        """Poll ``/health`` until every server is up; raise ``SamplerError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.health()
            if all(status.values()):
                return
            if time.monotonic() > deadline:
                down = ", ".join(u for u, ok in status.items() if not ok)
                raise SamplerError(f"SGLang servers not healthy after {timeout_s}s: {down}")
            time.sleep(poll_s)

    def update_weights_from_disk(
        self, model_path: str | Path, *, weight_version: str | None = None
    ) -> None:
        """Make every server load the checkpoint at ``model_path`` (a path *on the servers*).

        Raises ``SamplerError`` naming the server and its message if any refuses or fails.
        """
        body = {"model_path": str(model_path), "weight_version": weight_version}
        for url in self.urls:
            try:
                resp = self._client.post(f"{url}/update_weights_from_disk", json=body)
                payload = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise SamplerError(
                    f"{url}: update_weights_from_disk({model_path}) failed: {exc!r}"
                ) from exc
            if resp.status_code != 200 or not payload.get("success", False):
                message = payload.get("message", resp.text[:200])
                raise SamplerError(
                    f"{url}: update_weights_from_disk({model_path}) failed: {message}"
                )

    def load_lora_adapter(self, name: str, path: str | Path) -> None:
        """Make every server load the LoRA adapter at ``path`` (a path *on the servers*) as
        ``name`` (``AdapterReceiver``). The servers must run with ``--enable-lora`` and a
        ``--max-lora-rank`` / ``--lora-target-modules`` that cover the adapter."""
        self._admin("load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_lora_adapter(self, name: str) -> None:
        """Make every server drop adapter ``name``."""
        self._admin("unload_lora_adapter", {"lora_name": name})

    def use_lora_adapter(self, name: str | None) -> None:
        """Name adapter ``name`` in every request from now on (None: the base model)."""
        self.lora_name = name

    def _admin(self, endpoint: str, body: dict[str, Any]) -> None:
        """POST ``body`` to ``endpoint`` of every server; ``SamplerError`` naming the first
        that refuses (SGLang answers ``{"success": false, "error_message": ...}`` with 400)."""
        for url in self.urls:
            try:
                resp = self._client.post(f"{url}/{endpoint}", json=body)
                payload = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise SamplerError(f"{url}: {endpoint}({body}) failed: {exc!r}") from exc
            if resp.status_code != 200 or not payload.get("success", False):
                message = payload.get("error_message") or payload.get("message") or resp.text
                raise SamplerError(f"{url}: {endpoint}({body}) failed: {str(message)[:300]}")


class SGLangSession:
    """Requests in, finished generations out, as they finish (``HFSampler.session``'s interface).

    Each request is one single-prompt ``/generate`` call (routed, retried and failed exactly as
    in ``generate``). With a seed, a request's ``sampling_seed`` derives from the session's seed,
    its key and how many requests that key made before, so it does not depend on the order in
    which requests happen to finish.
    """

    def __init__(
        self, sampler: SGLangSampler, params: SamplingParams, pool: ThreadPoolExecutor
    ) -> None:
        self.sampler = sampler
        self.params = params
        self.pool = pool
        self.pending: dict[Future[list[Generation]], Hashable] = {}
        self.asked: dict[Hashable, int] = {}  # requests made per key, for per-request seeds
        self.placed: dict[Future[list[Generation]], tuple[int, tuple[int, ...]]] = {}
        self.load = [0] * len(sampler.urls)  # prompt tokens in flight per server
        self.groups: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (server, in flight)

    @property
    def busy(self) -> bool:
        """Whether any request is in flight."""
        return bool(self.pending)

    def submit(
        self, key: Hashable, prompt: list[int], max_new_tokens: int, stop_ids: frozenset[int]
    ) -> None:
        """Send one request; its generation comes out of a later ``step`` under ``key``."""
        nth = self.asked.get(key, 0)
        self.asked[key] = nth + 1
        seed = self.params.seed
        if seed is not None:
            seed = derive_seed(seed, "request", repr(key), nth)
        params = replace(
            self.params,
            max_new_tokens=max_new_tokens,
            stop_token_ids=tuple(sorted(set(self.params.stop_token_ids) | stop_ids)),
            seed=seed,
        )
        check_request([prompt], params)
        if max_new_tokens == 0:  # nothing to ask a server for
            done: Future[list[Generation]] = Future()
            done.set_result([Generation((), (), "length")])
            self.pending[done] = key
            return
        server = self._route(prompt)
        job = self.pool.submit(self.sampler._run_job, server, [0], [list(prompt)], params)
        self.pending[job] = key
        self.placed[job] = (server, tuple(prompt))

    def _route(self, prompt: list[int]) -> int:
        """``PrefixRouter``'s policy one request at a time: a continuation goes where its
        sequence is cached, a prompt already in flight (a GRPO sibling) joins it, and anything
        else goes to the server with the fewest prompt tokens in flight."""
        router = self.sampler.router
        server = 0 if router.n_servers == 1 else router.sticky_server(prompt)
        if server is None:
            server = self.groups.get(tuple(prompt), (None, 0))[0]
        if server is None:
            server = min(range(router.n_servers), key=self.load.__getitem__)
        self.load[server] += len(prompt)
        held, count = self.groups.get(tuple(prompt), (server, 0))
        self.groups[tuple(prompt)] = (held, count + 1)
        return server

    def _done(self, job: Future[list[Generation]]) -> None:
        server, prompt = self.placed.pop(job, (None, ()))
        if server is None:
            return
        self.load[server] -= len(prompt)
        held, count = self.groups[prompt]
        if count > 1:
            self.groups[prompt] = (held, count - 1)
        else:
            del self.groups[prompt]

    def step(self) -> list[tuple[Hashable, Generation]]:
        """Wait until at least one request finished; return every finished one."""
        if not self.pending:
            return []
        finished, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        for job in finished:
            self._done(job)
        return [(self.pending.pop(job), job.result()[0]) for job in finished]


def sampling_params_json(params: SamplingParams, indices: list[int]) -> dict | list[dict]:
    """SGLang ``sampling_params``: only keys SGLang accepts (it rejects unknown ones with 400).

    With a seed, each sample gets ``sampling_seed = seed + its index in the call``: one shared
    seed would make every sample of a GRPO group identical.
    """
    base = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.seed is None:
        return base
    return [{**base, "sampling_seed": params.seed + i} for i in indices]


def parse_generate_response(payload: Any, n: int, url: str) -> _Outcome:
    """Turn a ``/generate`` JSON body (list for a batch; object for one) into ``n`` generations."""
    items = [payload] if isinstance(payload, dict) else payload
    if not isinstance(items, list) or len(items) != n:
        got = len(items) if isinstance(items, list) else type(payload).__name__
        return _Outcome(error=f"{url}: expected {n} items in /generate response, got {got}")
    try:
        parsed = [_Item.model_validate(item) for item in items]
    except ValidationError as exc:
        return _Outcome(error=f"{url}: /generate response breaks the protocol: {exc}")
    return _Outcome(generations=[_to_generation(item, url) for item in parsed])


def _to_generation(item: _Item, url: str) -> Generation:
    triples = item.meta_info.output_token_logprobs
    if triples is None or [t[1] for t in triples] != item.output_ids:
        return Generation(
            (), (), "error", error=f"{url}: output_token_logprobs do not match output_ids"
        )
    # orjson writes NaN/inf as null; a sampled token's log-prob can only be -inf that way
    logprobs = tuple(-math.inf if t[0] is None else t[0] for t in triples)
    ids = tuple(item.output_ids)
    finish = item.meta_info.finish_reason
    if finish is None:
        return Generation(ids, logprobs, "error", item.text, error=f"{url}: no finish_reason")
    if finish.type in ("stop", "length"):
        return Generation(ids, logprobs, finish.type, item.text)
    if finish.type == "abort":
        return Generation(ids, logprobs, "abort", item.text, error=finish.message or "aborted")
    return Generation(
        ids, logprobs, "error", item.text, error=f"{url}: finish_reason {finish.type!r}"
    )


def _server_message(resp: httpx.Response) -> str:
    """SGLang's error text: ``{"error": str}``, ``{"error": {"message"}}`` or ``{"message"}``."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        err = body.get("error", body.get("message"))
        if isinstance(err, dict):
            err = err.get("message")
        if err is not None:
            return str(err)
    return resp.text[:500]
