"""The annotation queue in a real browser: five pairs labelled with the keyboard only, kept
after a reload; a second author's labels give the agreement table."""

from __future__ import annotations

import pytest

from storage import Store
from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, fill, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def _sign_in(page, name: str) -> None:
    page.locator("#sign-in").get_by_text("Sign in").first.click()
    fill(page, "sign-in-user", name)
    fill(page, "sign-in-pass", "pw")
    page.locator("#sign-in-button").click()
    page.get_by_text(f"Signed in as {name}").wait_for(timeout=LOAD_MS)


def test_five_pairs_labelled_by_keyboard_then_agreement(tmp_path):
    make_run(tmp_path)
    # bo labelled the first five pairs before: "faithful" on all but the third
    store = Store(tmp_path)
    first = list(store.pairs(run_id="train-demo", limit=5)["call_id"])
    for i, call in enumerate(first):
        store.annotate("call", call, "other" if i == 2 else "faithful", author="bo")
    store.close()
    with studio_server(tmp_path, ("--auth", "ana:pw")) as url, chromium_page() as page:
        open_page(page, url, "?tab=annotate")
        _sign_in(page, "ana")
        choose(page, "queue-run", "train-demo")
        progress = page.locator("#queue-progress")
        progress.get_by_text("0 / 16").wait_for(timeout=LOAD_MS)
        page.locator("#queue-diff table").wait_for(timeout=LOAD_MS)
        page.locator("body").click(position={"x": 5, "y": 5})  # keys go to the page, not a field
        for n in range(1, 6):
            head = page.locator("#queue-head").inner_text()
            page.keyboard.press("1")  # faithful
            page.keyboard.press("Enter")  # save and next
            progress.get_by_text(f"{n} / 16").wait_for(timeout=LOAD_MS)
            page.wait_for_function(
                "h => document.querySelector('#queue-head').innerText !== h", arg=head
            )
        page.keyboard.press("Alt+ArrowLeft")  # back to the fifth, labelled a moment ago
        page.locator("#queue-head").get_by_text(first[4], exact=True).wait_for(timeout=LOAD_MS)

        page.reload()
        open_page(page, url, "?tab=annotate&run=train-demo")
        page.locator("#queue-diff table").wait_for(timeout=LOAD_MS)  # the deep link's pair
        _sign_in(page, "ana")
        progress.get_by_text("5 / 16").wait_for(timeout=LOAD_MS)  # ana's, once signed in
        agreement = page.locator("#queue-agreement")
        agreement.get_by_text("ana · bo").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        # 5 shared items, ana all faithful, bo 4 faithful + 1 other: p_o 0.8, p_e 0.8, kappa 0
        assert agreement.get_by_text("0.8", exact=True).filter(visible=True).count() == 1
        shot(page, "annotate-queue")
    history = Store(tmp_path)  # the studio has stopped: its database is free again
    try:
        mine = history.annotations(run_id="train-demo")
        assert sorted(mine.loc[mine["author"] == "ana", "target_id"]) == sorted(first)
    finally:
        history.close()
