"""A synchronous handle on one MCP server session (the SDK is async, environments are not).

``McpConnection`` runs the SDK's ``Client`` on a private event loop thread (an anyio blocking
portal), one per connection, so environments of a batch never share a loop or a server. A
stdio server is started with the connection and stopped with ``close()`` (the SDK closes its
stdin, waits, then kills its process group), also when the connection is garbage collected or
the interpreter exits, so no server process outlives its episode. Every wait is bounded:
starting by ``start_timeout_s``, each call by ``call_timeout_s``.

What goes wrong is sorted into three kinds: the server cannot be started (``McpStartError``,
naming the command), a call fails in a way that is the *server's* fault (``EnvironmentFault``
with ``env_exited``, ``env_timeout`` or ``env_malformed``), or the server answered normally
(``CallToolResult``, ``isError`` included, which the environment turns into a tool error).
"""

from __future__ import annotations

import concurrent.futures
import tempfile
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

import anyio
import mcp_types
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from envace_engine.environments.base import EnvironmentFault
from envace_engine.types import StopReason

# Slack on top of an in-loop timeout before the calling thread gives up waiting on the loop.
_GRACE_S = 5.0
# The SDK's stdio shutdown is bounded (flush 0.5 s, exit 2 s, SIGTERM 2 s, reap 2 s).
_CLOSE_S = 10.0
_STDERR_TAIL = 800  # characters of the server's stderr quoted in an error


class McpStartError(ValueError):
    """The MCP server could not be started or did not complete the handshake."""


@dataclass(frozen=True)
class ServerSpec:
    """How to reach a server: a stdio ``command`` with ``args`` (started per connection), or
    a streamable-HTTP ``url`` (already running: EnvACE does not start it). ``reset_tool``: a
    tool called with ``reset_arguments`` when each episode's session opens (hidden from the
    agent), how a URL server is put back in its initial state."""

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    call_timeout_s: float = 30.0
    start_timeout_s: float = 30.0
    reset_tool: str | None = None
    reset_arguments: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The command line (or URL), as error messages name the server."""
        if self.url is not None:
            return self.url
        return " ".join([str(self.command), *self.args])


class McpConnection:
    """One live MCP session: ``tools`` (listed at start), ``call(name, arguments)``, ``close()``."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._closed = False
        self._broken: EnvironmentFault | None = None  # a session that broke stays broken
        self._lock = threading.Lock()
        # stderr goes to a file (an anonymous one) so an error can quote it; closed by close().
        file = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._errlog = cast(TextIO, file)
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        ready: concurrent.futures.Future[Client] = concurrent.futures.Future()
        stop = self._portal.call(anyio.Event)  # an anyio event is made inside its loop
        self._main = self._portal.start_task_soon(_serve, self._transport(), ready, stop)
        # The last resort against a leaked server (close() forgotten, or interpreter exit). The
        # session task holds no reference to this object, so garbage collection can trigger it.
        self._finalizer = weakref.finalize(
            self, _shutdown, self._portal, self._portal_cm, self._main, stop, ready
        )
        try:
            # Bounded here, not inside the loop: a timeout scope around the SDK's
            # entering of its task groups could not be exited in order.
            self._client = ready.result(spec.start_timeout_s)
            self.tools: list[mcp_types.Tool] = self._run(self._list_tools, spec.start_timeout_s)
        except Exception as err:
            error = self._start_error(err)  # before close(): it quotes the server's stderr
            self.close()
            raise error from err
        except BaseException:  # an interrupt: stop the server, then let it through
            self.close()
            raise

    def _transport(self) -> Any:
        spec = self.spec
        if spec.url is not None:
            return spec.url  # the SDK's streamable-HTTP client
        params = StdioServerParameters(
            command=str(spec.command), args=list(spec.args), env=dict(spec.env), cwd=spec.cwd
        )
        return stdio_client(params, errlog=self._errlog)

    async def _list_tools(self) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a server whose pages never end cannot hang the listing
            page = await self._client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """One ``tools/call``. A JSON-RPC error answer raises ``MCPError`` (the server refused
        the call); a broken server raises ``EnvironmentFault``."""
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise EnvironmentFault(StopReason.ENV_EXITED, f"{self._who()}: connection closed")
        try:
            return self._call(name, arguments)
        except EnvironmentFault as fault:
            self._broken = fault
            raise

    def _call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        async def send() -> mcp_types.CallToolResult:
            return await self._client.call_tool(name, arguments)

        try:
            result: mcp_types.CallToolResult = self._run(send, self.spec.call_timeout_s)
            return result
        except EnvironmentFault:
            raise
        except MCPError as err:
            if err.code == mcp_types.CONNECTION_CLOSED:
                raise self._fault(StopReason.ENV_EXITED, "exited mid-episode", err) from err
            if err.code == mcp_types.REQUEST_TIMEOUT:
                raise self._fault(StopReason.ENV_TIMEOUT, "timed out", err) from err
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as err:
            raise self._fault(StopReason.ENV_EXITED, "exited mid-episode", err) from err
        except ValidationError as err:
            raise self._fault(StopReason.ENV_MALFORMED, "sent a malformed result", err) from err
        except Exception as err:  # e.g. structured content against its own output schema
            raise self._fault(StopReason.ENV_MALFORMED, "broke the protocol", err) from err

    def _run(self, make: Callable[[], Any], timeout: float) -> Any:
        """Run ``make()`` on the loop, bounded by ``timeout``; a timeout is an ``env_timeout``."""

        async def bounded() -> Any:
            with anyio.fail_after(timeout):
                return await make()

        with self._lock:  # one request at a time: an episode's calls are sequential anyway
            future = self._portal.start_task_soon(bounded)
            try:
                return future.result(timeout + _GRACE_S)
            except TimeoutError as err:  # in the loop (fail_after) or here (a stuck loop)
                future.cancel()
                what = f"gave no answer in {timeout:g} s"
                raise self._fault(StopReason.ENV_TIMEOUT, what, err) from err

    def _fault(self, stop: StopReason, what: str, err: BaseException) -> EnvironmentFault:
        said = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return EnvironmentFault(stop, f"{self._who()} {what} ({said[:300]}){self._stderr()}")

    def _start_error(self, err: BaseException) -> McpStartError:
        while isinstance(err, BaseExceptionGroup) and err.exceptions:  # the SDK's task groups
            err = err.exceptions[0]
        if isinstance(err, TimeoutError | EnvironmentFault):
            what = f"did not answer the MCP handshake within {self.spec.start_timeout_s:g} s"
        else:
            what = f"failed to start ({type(err).__name__}: {str(err)[:300]})"
        return McpStartError(f"{self._who()} {what}{self._stderr()}")

    def _who(self) -> str:
        return f"MCP server `{self.spec.describe()}`"

    def _stderr(self) -> str:
        """The tail of what the server wrote to stderr, for an error message."""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            text = self._errlog.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""
        return f"\n--- server stderr (last lines) ---\n{text}" if text else ""

    def close(self) -> None:
        """Stop the session and its server process; idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()  # runs _shutdown once (and never again at exit)
        self._errlog.close()


async def _serve(
    transport: Any, ready: concurrent.futures.Future[Client], stop: anyio.Event
) -> None:
    """A session's whole life in one task (the SDK's task groups must stay in the task that
    entered them): connect, hand the client over, wait for the stop event, disconnect."""
    try:
        async with Client(transport, cache=None) as client:
            ready.set_result(client)
            await stop.wait()
    except BaseException as err:
        if not ready.done():
            ready.set_exception(err)
        raise


def _shutdown(
    portal: BlockingPortal,
    portal_cm: AbstractContextManager[BlockingPortal],
    main: concurrent.futures.Future[None],
    stop: anyio.Event,
    ready: concurrent.futures.Future[Client],
) -> None:
    """End the session task (by its stop event once connected, else by cancelling it), then
    the loop thread. Every wait is bounded; errors are swallowed: the session is going away."""
    try:
        if ready.done() and not ready.exception() and not main.done():
            portal.call(stop.set)  # a clean disconnect: the SDK stops the server process
        else:
            main.cancel()
        concurrent.futures.wait([main], timeout=_CLOSE_S)
    except BaseException:
        main.cancel()
    with suppress(BaseException):  # a failed session task re-raises here: already reported
        portal_cm.__exit__(None, None, None)
