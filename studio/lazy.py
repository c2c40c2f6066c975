"""Page loads that do only what the asked page needs.

Every page lives in one Blocks app, so a page load fires every page's load handlers: a deep link
to one page (the inspector at an episode, the queue at a pair) would wait behind the others'
queries on two cores. ``when_shown`` draws a page's summary only when the URL's ``?tab=`` asks
for that page (no ``?tab=``: the first page) and each time its tab is selected. Load handlers
run outside the queue (``QUEUE_LOADS`` is off; bench/studio_latency.py measures the difference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gradio as gr

FIRST_PAGE = "home"  # the tab a URL without ?tab= shows (studio.app)
# Page-load handlers skip the queue: a load fires one handler per page, and each queued one
# costs a join and an event-stream message before it runs; most return "no change" at once.
QUEUE_LOADS = False


def asked_page(request: gr.Request | None) -> str:
    """The page a request's ``?tab=`` asks for."""
    params = dict(request.query_params) if request is not None else {}
    return params.get("tab") or FIRST_PAGE


def when_shown(
    demo: gr.Blocks,
    tab: gr.Tab,
    page: str,
    draw: Callable[[], Any],
    outputs: Sequence[gr.components.Component],
) -> None:
    """Fill ``outputs`` with ``draw()`` on a page load that shows ``page`` and on each select of
    its ``tab``; another page's load leaves them as they are."""
    many = len(outputs) > 1

    def on_load(request: gr.Request) -> Any:
        if asked_page(request) == page:
            return draw()
        return tuple(gr.update() for _ in outputs) if many else gr.update()

    demo.load(on_load, None, list(outputs), show_progress="hidden", queue=QUEUE_LOADS)
    tab.select(draw, None, list(outputs), show_progress="hidden")
