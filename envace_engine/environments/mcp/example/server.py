"""The example MCP server: a small shop's inventory, over stdio, one process per episode.

Run as ``python -m envace_engine.environments.mcp.example.server``. Its state (four items and
their units) lives in the process, so every episode starts from the same stock and what one
episode changes another never sees. Four tools: ``list_items``, ``get_stock``, ``add_stock``,
``remove_stock`` (``--http PORT``: one shared inventory, and a fifth tool ``reset`` for the
suite's ``reset_tool``); an unknown item, a non-positive quantity or removing more units than are in
stock is a tool error (``isError``) the model reads.

``--fault KIND --after N`` makes the server misbehave on its ``N+1``-th tool call, for the
tests of the suite's fault handling (docs/mcp.md): ``exit`` (the process dies mid-call),
``hang`` (the call never returns; the process blocks, so only a kill ends it) and ``malformed``
(the response is not a valid ``CallToolResult``).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCResponse

INITIAL_STOCK = {"apples": 5, "pears": 3, "plums": 0, "figs": 12}
FAULTS = ("exit", "hang", "malformed")


class Inventory:
    """The shop's stock; every method is one tool."""

    def __init__(self) -> None:
        self.stock = dict(INITIAL_STOCK)

    def list_items(self) -> dict[str, int]:
        """Every item in the shop and its units in stock."""
        return dict(self.stock)

    def get_stock(self, item: str) -> dict[str, Any]:
        """The units in stock of one item."""
        return {"item": item, "units": self.stock[self._known(item)]}

    def add_stock(self, item: str, units: int) -> dict[str, Any]:
        """Receive ``units`` of an item (a new item is added to the shop); the new total."""
        _positive(units)
        self.stock[item] = self.stock.get(item, 0) + units
        return {"item": item, "units": self.stock[item]}

    def remove_stock(self, item: str, units: int) -> dict[str, Any]:
        """Ship ``units`` of an item; refused when fewer are in stock. The new total."""
        _positive(units)
        have = self.stock[self._known(item)]
        if units > have:
            raise ToolError(f"cannot remove {units} {item}: only {have} in stock")
        self.stock[item] = have - units
        return {"item": item, "units": self.stock[item]}

    def _known(self, item: str) -> str:
        if item not in self.stock:
            raise ToolError(f"unknown item {item!r}; items: {', '.join(sorted(self.stock))}")
        return item


def _positive(units: int) -> None:
    if units < 1:
        raise ToolError(f"units must be at least 1, got {units}")


class Fault:
    """Counts tool calls and misbehaves on the one after ``after`` (``kind`` None: never)."""

    def __init__(self, kind: str | None, after: int) -> None:
        self.kind, self.after, self.calls = kind, after, 0
        self.corrupt_next = False  # malformed: the write stream rewrites the next response

    def on_call(self) -> None:
        self.calls += 1
        if self.kind is None or self.calls <= self.after:
            return
        if self.kind == "exit":
            os._exit(3)  # no cleanup, no response: as a crashed server
        if self.kind == "hang":
            time.sleep(3600)  # never answers (the SDK runs sync tools in a worker thread)
        self.corrupt_next = True


class CorruptingWriter:
    """The stdio write stream, rewriting one tool response into an invalid result."""

    def __init__(self, inner: Any, fault: Fault) -> None:
        self.inner, self.fault = inner, fault

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if self.fault.corrupt_next and isinstance(message, JSONRPCResponse):
            self.fault.corrupt_next = False
            # ``content`` must be a list of content blocks: no client can read this.
            bad = JSONRPCResponse(jsonrpc="2.0", id=message.id, result={"content": "oops"})
            item = SessionMessage(bad, item.metadata)
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> CorruptingWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def build(fault: Fault, shared: bool = False) -> MCPServer:
    """The server with the inventory's four tools; ``fault`` sees every call first.
    ``shared`` (one server for every episode, over HTTP): a fifth tool, ``reset``, puts the
    stock back to its initial state (a suite names it as its ``reset_tool``)."""
    shop = Inventory()
    server: MCPServer = MCPServer("envace-inventory", log_level="WARNING")

    if shared:

        @server.tool()
        def reset(stock: dict[str, int] | None = None) -> dict[str, int]:
            """Put the shop back to its initial stock (or to ``stock``); the stock."""
            wanted = dict(INITIAL_STOCK if stock is None else stock)
            if any(units < 0 for units in wanted.values()):
                raise ToolError(f"stock units must be 0 or more (got {wanted})")
            shop.stock = wanted
            return shop.list_items()

    @server.tool()
    def list_items() -> dict[str, int]:
        """Every item in the shop and its units in stock."""
        fault.on_call()
        return shop.list_items()

    @server.tool()
    def get_stock(item: str) -> dict[str, Any]:
        """The units in stock of one item."""
        fault.on_call()
        return shop.get_stock(item)

    @server.tool()
    def add_stock(item: str, units: int) -> dict[str, Any]:
        """Receive units of an item (a new item joins the shop); returns the new total."""
        fault.on_call()
        return shop.add_stock(item, units)

    @server.tool()
    def remove_stock(item: str, units: int) -> dict[str, Any]:
        """Ship units of an item; refused when fewer are in stock. Returns the new total."""
        fault.on_call()
        return shop.remove_stock(item, units)

    return server


async def serve(fault: Fault) -> None:
    server = build(fault)
    if fault.kind != "malformed":
        await server.run_stdio_async()  # the SDK's public stdio loop
        return
    # Only a test's malformed variant reaches into the SDK (a private attribute): to put its
    # corrupting write stream between the server and stdout.
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read, write):
        writer = CorruptingWriter(write, fault)
        await lowlevel.run(read, writer, lowlevel.create_initialization_options())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=FAULTS, default=None)
    parser.add_argument("--after", type=int, default=0, help="good calls before the fault")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP instead")
    args = parser.parse_args(argv)
    if args.http is not None:  # one shared inventory for every client: state is not per episode
        build(Fault(args.fault, args.after), shared=True).run("streamable-http", port=args.http)
        return
    anyio.run(serve, Fault(args.fault, args.after))


if __name__ == "__main__":
    main()
