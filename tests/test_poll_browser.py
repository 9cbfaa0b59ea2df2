"""The class poll in headless Chromium: the projector (the whole app, presenter link, 1920×1080) starts a
poll; a phone (390×844, touch) opens the URL the projector shows, taps an answer, changes it; the tap
appears in the projector's count; the reveal reaches the phone; "Next question" moves both on; the end
shows the summary on the projector and "ended" on the phone. The phone page has no horizontal scroll
and every button is at least 44 px tall.

Screenshots go to $NANOSPEC_POLL_SHOTS (default artifacts/poll/, gitignored). Needs Python `playwright`
and Chromium at /usr/bin/chromium (or $NANOSPEC_CHROMIUM); skipped otherwise.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.browser import browser, require_browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SHOTS = Path(os.environ.get("NANOSPEC_POLL_SHOTS", ROOT / "artifacts" / "poll"))
WAIT_MS = 15_000


def _never_load(*args, **kwargs):
    raise AssertionError("the class poll must never load a model")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """The whole app with the poll's routes, as `python app.py` launches it, on a fresh poll database."""
    require_browser()
    from app.dev.served import free_port
    from app.lesson import lesson_data
    from app.poll.routes import poll_app_kwargs
    from app.poll.store import default_store
    from app.ui import build_app

    try:
        lesson_data()
    except FileNotFoundError as exc:
        pytest.skip(f"no recorded lesson traces: {exc}")
    mp = pytest.MonkeyPatch()
    mp.setenv("NANOSPEC_POLL_DB", str(tmp_path_factory.mktemp("poll") / "poll.sqlite3"))
    mp.delenv("NANOSPEC_POLL_URL", raising=False)
    default_store.cache_clear()
    demo = build_app(_never_load)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                app_kwargs=poll_app_kwargs())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
        default_store.cache_clear()
        mp.undo()


def _phone_fits(phone) -> None:
    """No horizontal scrolling; every button (the tap targets) at least 44 px tall and wide."""
    overflow = phone.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the phone page scrolls sideways by {overflow} px"
    for box in phone.locator("button").evaluate_all("bs => bs.map(b => b.getBoundingClientRect())"
                                                    ".map(r => [r.width, r.height])"):
        assert box[0] >= 44 and box[1] >= 44, f"a tap target is {box[0]:.0f}×{box[1]:.0f} px"


def _count(projector) -> int:
    return int(projector.locator("#poll-live").get_attribute("data-total"))


def test_a_phone_tap_reaches_the_projector_and_the_reveal_reaches_the_phone(app_url, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    projector = browser.new_page(viewport={"width": 1920, "height": 1080})
    projector.goto(app_url + "?chapter=2&presenter=1")
    projector.locator("#lesson-text h2", has_text="Chapter 2 ·").wait_for(timeout=WAIT_MS)
    projector.locator("#poll-start").click()
    card = projector.locator("#poll-join-card")
    card.wait_for(timeout=WAIT_MS)
    code = card.locator(".code").inner_text().strip()
    url = card.locator(".url").inner_text().strip()
    assert re.fullmatch(r"[A-Z2-9]{6}", code) and url == f"{app_url}poll/{code}"
    assert card.locator(".qr svg").count() == 1
    code_box = card.locator(".code").bounding_box()
    assert code_box["height"] >= 100, "the code must be readable from the back row"
    projector.wait_for_timeout(500)
    projector.screenshot(path=str(SHOTS / "projector-join.png"))

    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                              device_scale_factor=2)
    phone = ctx.new_page()
    phone.goto(url)
    phone.locator("h1").wait_for(timeout=WAIT_MS)
    assert "How many of these will the target accept?" in phone.locator("h1").inner_text()
    assert "Question 1 of" in phone.locator("#poll").inner_text()
    _phone_fits(phone)
    phone.screenshot(path=str(SHOTS / "phone-question.png"))

    projector.locator("#poll-join-hide").click()
    live = projector.locator("#poll-live")
    live.wait_for(timeout=WAIT_MS)
    assert _count(projector) == 0
    options = phone.locator("button.opt")
    options.nth(1).tap()
    phone.locator("button.opt.mine").wait_for(timeout=WAIT_MS)
    projector.wait_for_function("document.querySelector('#poll-live')?.dataset.total === '1'", timeout=WAIT_MS)
    assert projector.locator("#poll-live-html .num[data-choice='1']").inner_text().startswith("1")
    options.nth(3).tap()   # a change of mind: still one answer, now on choice 3
    projector.wait_for_function("document.querySelector(\"#poll-live-html .num[data-choice='3']\")"
                                "?.textContent.startsWith('1')", timeout=WAIT_MS)
    assert _count(projector) == 1
    assert projector.locator("#poll-live-html .num[data-choice='1']").inner_text().startswith("0")
    assert "(you)" in phone.locator("button.opt.mine").inner_text()
    _phone_fits(phone)
    phone.screenshot(path=str(SHOTS / "phone-answered.png"))
    projector.screenshot(path=str(SHOTS / "projector-live.png"))

    projector.locator("#poll-reveal").click()
    projector.locator("#poll-live-html .poll-truth").wait_for(timeout=WAIT_MS)
    assert re.search(r"[01] of 1 answered “\d+”, the right answer\.", projector.locator(".poll-truth").inner_text())
    phone.locator(".why").wait_for(timeout=WAIT_MS)
    assert "right answer" in phone.locator("#poll").inner_text()
    assert phone.locator("button.opt.right").count() == 1
    assert phone.locator("button.opt:disabled").count() == options.count()   # no change after the reveal
    _phone_fits(phone)
    phone.screenshot(path=str(SHOTS / "phone-revealed.png"))
    projector.locator("#lesson-plot .js-plotly-plot").first.wait_for(timeout=WAIT_MS)
    projector.wait_for_timeout(700)
    projector.screenshot(path=str(SHOTS / "projector-revealed.png"))

    projector.locator("#poll-next").click()
    projector.locator("#lesson-text h2", has_text="Chapter 3 ·").wait_for(timeout=WAIT_MS)
    phone.wait_for_function("document.querySelector('#poll').innerText.includes('Question 2 of')", timeout=WAIT_MS)
    assert phone.locator("button.opt.mine").count() == 0

    projector.locator("#poll-end").click()
    projector.locator("#poll-summary-card").wait_for(timeout=WAIT_MS)
    summary = projector.locator("#poll-summary-card").inner_text()
    assert "Chapter 2" in summary and "Chapter 3" in summary and "Chapter 4" not in summary
    phone.wait_for_function("document.querySelector('#poll').innerText.includes('ended')", timeout=WAIT_MS)
    projector.locator("#poll-summary-card").scroll_into_view_if_needed()
    projector.screenshot(path=str(SHOTS / "projector-summary.png"))
    ctx.close()
    projector.close()


def test_unknown_code_page_on_a_phone(app_url, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone = ctx.new_page()
    r = phone.goto(app_url + "poll/NOPE22")
    assert r.status == 404 and "No poll with this code" in phone.inner_text("body")
    phone.goto(app_url + "poll")
    phone.fill("#code", "nope22")
    phone.locator("form button").tap()
    phone.wait_for_url("**/poll/NOPE22")
    _phone_fits(phone)
    ctx.close()
