"""``studio.lazy.PageLoads``: one load event runs only the asked page's handlers."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from studio.lazy import PageLoads


def _dispatch(loads: PageLoads, demo: gr.Blocks):
    loads.install(demo)
    (fn,) = [f.fn for f in demo.fns.values() if f.targets and f.targets[0][1] == "load"]
    return fn


def test_only_the_asked_pages_handlers_run_and_fill_their_outputs() -> None:
    calls: list[str] = []
    loads = PageLoads()
    with gr.Blocks() as demo:
        a, b, c = gr.Textbox(), gr.Textbox(), gr.Textbox()
        n = gr.Number(3)

        def first(request: object) -> tuple[str, str]:
            calls.append("first")
            return "a!", "b!"

        def second(x: float, request: object) -> str:
            calls.append("second")
            return f"c{x}"

        loads.on("home", first, (), [a, b])
        loads.on("inspector", second, [n], [c])
        fn = _dispatch(loads, demo)  # inside the Blocks, as the app installs it
    home = fn(SimpleNamespace(query_params={}), 7)  # no ?tab=: the first page, home
    assert calls == ["first"] and home[:2] == ["a!", "b!"]
    assert home[2] == gr.update()
    insp = fn(SimpleNamespace(query_params={"tab": "inspector"}), 7)
    assert calls == ["first", "second"] and insp[2] == "c7"
    assert insp[0] == gr.update() and insp[1] == gr.update()
    assert fn(SimpleNamespace(query_params={"tab": "budget"}), 7) == [gr.update()] * 3


def test_two_handlers_writing_one_component_are_refused() -> None:
    loads = PageLoads()
    with gr.Blocks() as demo:
        a = gr.Textbox()
        loads.on("home", lambda r: "x", (), [a])
        loads.on("study", lambda r: "y", (), [a])
        with pytest.raises(ValueError, match="same component"):
            loads.install(demo)
