"""Page loads that do only what the asked page needs, in one request.

Every page lives in one Blocks app. Were each page to register its own load handler, a page load
would send one request per page, and a deep link to one page (the inspector at an episode, the
queue at a pair) would wait behind the others' round trips on two cores. Pages register their
load handlers with a ``PageLoads`` instead, each under the page it serves; the app installs one
load event for all of them, which runs only the handlers of the page the URL's ``?tab=`` asks
for (no ``?tab=``: the first page) and leaves every other output as it is. ``when_shown`` also
redraws a page's summary each time its tab is selected. The load runs outside the queue
(``QUEUE_LOADS`` is off; bench/studio_latency.py measures the difference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

FIRST_PAGE = "home"  # the tab a URL without ?tab= shows (studio.app)
# The page load skips the queue: a queued event costs a join and an event-stream message
# before it runs.
QUEUE_LOADS = False


def asked_page(request: gr.Request | None) -> str:
    """The page a request's ``?tab=`` asks for."""
    params = dict(request.query_params) if request is not None else {}
    return params.get("tab") or FIRST_PAGE


@dataclass(frozen=True)
class _Handler:
    page: str
    fn: Callable[..., Any]  # fn(*input values, request) -> one value per output
    inputs: tuple[gr.components.Component, ...]
    outputs: tuple[gr.components.Component, ...]


@dataclass
class PageLoads:
    """The app's page-load handlers, installed as one load event (``install``)."""

    handlers: list[_Handler] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)

    def on(
        self,
        page: str,
        fn: Callable[..., Any],
        inputs: Sequence[gr.components.Component],
        outputs: Sequence[gr.components.Component],
    ) -> None:
        """Run ``fn(*inputs' values, request)`` on a load of ``page``; it returns one value per
        output (a tuple; a bare value when there is one output)."""
        self.handlers.append(_Handler(page, fn, tuple(inputs), tuple(outputs)))

    def then_js(self, script: str) -> None:
        """Run ``script`` in the browser after the load's answer is drawn (any page)."""
        self.scripts.append(script)

    def install(self, demo: gr.Blocks) -> None:
        """Register the one load event; refuses two handlers writing the same component."""
        inputs = _union(c for h in self.handlers for c in h.inputs)
        outputs = list(_union(c for h in self.handlers for c in h.outputs))
        if len(outputs) != sum(len(h.outputs) for h in self.handlers):
            raise ValueError("two page-load handlers write the same component")
        where = {id(c): i for i, c in enumerate(inputs)}

        def dispatch(request: gr.Request, *values: Any) -> list[Any]:
            page = asked_page(request)
            answer: list[Any] = [gr.update()] * len(outputs)
            at = 0
            for h in self.handlers:
                if h.page == page:
                    got = h.fn(*(values[where[id(c)]] for c in h.inputs), request)
                    answer[at : at + len(h.outputs)] = got if len(h.outputs) > 1 else [got]
                at += len(h.outputs)
            return answer

        event = demo.load(
            dispatch, list(inputs), outputs, show_progress="minimal", queue=QUEUE_LOADS
        )
        for script in self.scripts:
            event = event.then(None, None, None, js=script)


def _union(components: Any) -> tuple[gr.components.Component, ...]:
    """Components in first-seen order, each once."""
    seen: dict[int, gr.components.Component] = {}
    for c in components:
        seen.setdefault(id(c), c)
    return tuple(seen.values())


def when_shown(
    loads: PageLoads,
    tab: gr.Tab,
    page: str,
    draw: Callable[[], Any],
    outputs: Sequence[gr.components.Component],
) -> None:
    """Fill ``outputs`` with ``draw()`` on a page load that shows ``page`` and on each select of
    its ``tab``; another page's load leaves them as they are."""
    loads.on(page, lambda _request: draw(), (), outputs)
    tab.select(draw, None, list(outputs), show_progress="hidden")
