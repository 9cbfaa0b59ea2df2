"""What a newcomer, a phone and a projector see (issue 47), in headless Chromium, on a loader that never loads:
Run on the first screen at 1280×720 and on a phone (390×844); Compare without Live's controls and with vLLM
rows disabled when vLLM is missing; an empty prompt told on the prompt box alone; the allowed range beside
the answer length; presenter mode (?presenter=1, 1920×1080) with no visible text under 18 px and none cut;
chapter 12 at 1280×720 with whole race lines, its step label whole, the answer so far and the play speed
beside ▶ Play on the first screen.

Needs Python `playwright` and Chromium at /usr/bin/chromium (or $NANOSPEC_CHROMIUM); skipped otherwise.
"""

from __future__ import annotations

import pytest

from tests.browser import browser, require_browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.browser

PRESENTER_MIN_PX = 18


def _never_load(*args, **kwargs):
    raise AssertionError("these views must never load a model")


@pytest.fixture(scope="module")
def url():
    require_browser()
    from app.ui import build_app

    demo = build_app(_never_load)
    _, local, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    yield local
    demo.close()


def _open(browser, url: str, width: int, height: int, query: str = ""):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(30_000)
    page.goto(url + query, wait_until="load")
    page.locator("#prompt textarea").wait_for(state="attached")
    page.wait_for_timeout(500)
    return page


def _in_view(page, selector: str) -> dict:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not shown"
    size = page.viewport_size
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"] + 1, \
        f"{selector} spans {box['y']:.0f}-{box['y'] + box['height']:.0f} px; the screen is {size['height']} px high"
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"] + 1, f"{selector} runs off the side"
    return box


# -- first screen and controls --------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(1280, 720), (390, 844)], ids=["1280x720", "phone-390x844"])
def test_run_is_on_the_first_screen(url, browser, size):
    page = _open(browser, url, *size)
    assert page.evaluate("window.scrollY") == 0
    _in_view(page, "#run-btn")
    _in_view(page, "#prompt textarea")
    if size[0] >= 1280:
        _in_view(page, "button[role=tab]:has-text('Live')")
    page.close()


# every dropdown in view: the input's text box (its content box, inside the padding) ends before the caret
DROPDOWN_CARETS_JS = """() => [...document.querySelectorAll('input[role=combobox], input[role=listbox]')]
  .filter(inp => inp.checkVisibility()).map(inp => {
    const caret = inp.parentElement.querySelector('.icon-wrap, .dropdown-arrow');
    const box = inp.getBoundingClientRect(), cs = getComputedStyle(inp);
    return {value: inp.value, textRight: box.right - parseFloat(cs.paddingRight),
            caretLeft: caret ? caret.getBoundingClientRect().left : Infinity};
  })"""


@pytest.fixture(scope="module")
def picker_url():
    """The page as `python app.py` builds it: with the pair picker (a dropdown), on loaders that never load."""
    from app.pairs import preset_provider
    from app.ui import build_app

    demo = build_app(provider=preset_provider("cpu", loader_for=lambda preset: _never_load))
    _, local, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    yield local
    demo.close()


def test_dropdown_text_stays_clear_of_its_caret_on_a_phone(url, picker_url, browser):
    page = _open(browser, picker_url, 390, 844)
    page.locator("#pair-picker input").wait_for(state="visible")
    boxes = page.evaluate(DROPDOWN_CARETS_JS)
    page.locator("button[role=tab]", has_text="Lesson").click()
    page.wait_for_timeout(800)
    boxes += page.evaluate(DROPDOWN_CARETS_JS)
    assert any("shipped head" in b["value"] for b in boxes), boxes
    for b in boxes:
        assert b["textRight"] <= b["caretLeft"] + 0.5, \
            f"the caret (from x={b['caretLeft']:.0f}) covers {b['value']!r} (text box to x={b['textRight']:.0f})"
    page.close()


def test_compare_hides_live_controls_and_disables_missing_vllm(url, browser):
    from app import peers

    page = _open(browser, url, 1280, 720)
    assert page.locator("#method").is_visible() and page.locator("#run-btn").is_visible()
    page.locator("button[role=tab]", has_text="Compare").click()
    page.locator("#compare-btn").wait_for(state="visible")
    page.wait_for_function("!document.querySelector('#run-btn') || !document.querySelector('#run-btn').checkVisibility()")
    assert not page.locator("#method").is_visible()
    assert "press Run" not in page.locator("body").inner_text()
    offered, about = peers.control_info()
    boxes = page.locator("#compare-peers input[type=checkbox]")
    assert boxes.count() == len(peers.CHOICES)
    assert all(boxes.nth(i).is_disabled() != offered for i in range(boxes.count()))
    if not offered:
        assert "not installed" in page.locator("#compare-peers").inner_text()
    page.locator("button[role=tab]", has_text="Live").click()
    page.locator("#run-btn").wait_for(state="visible")
    assert page.locator("#method").is_visible()
    page.close()


def test_answer_length_states_its_range_and_settings_show_whole_bounds(url, browser):
    page = _open(browser, url, 1280, 720)
    assert "allowed: 1 to 512" in page.locator("#max-new-tokens").inner_text()
    page.get_by_text("Tree, sampling and vocabulary settings").first.click()
    page.locator("#capacity").wait_for(state="visible")
    for elem in ("capacity", "copy-branch", "max-new-tokens", "depth"):
        ends = page.locator(f"#{elem} .min_value, #{elem} .max_value")
        for i in range(ends.count()):
            cut = ends.nth(i).evaluate("e => e.scrollWidth > e.clientWidth + 1 || "
                                       "e.getBoundingClientRect().right > e.closest('.block').getBoundingClientRect().right + 1")
            assert not cut, f"#{elem}: the end label {ends.nth(i).inner_text()!r} is cut"
    page.close()


def test_empty_prompt_is_told_on_the_prompt_box_only(url, browser):
    page = _open(browser, url, 1280, 720)
    page.locator("#run-btn").click()
    message = page.locator("#prompt").get_by_text("prompt is empty")
    message.wait_for(timeout=15_000)
    page.wait_for_timeout(1000)
    # no red "Error" pills on the outputs, no toast over the controls
    for selector in ("#run-status", "#answer", "#kpis"):
        assert "Error" not in page.locator(selector).inner_text(), f"{selector} shows an error badge"
    assert page.locator(".toast-body").count() == 0
    page.close()


# -- presenter mode and the lesson at 1280x720 -------------------------------------------------------------
SMALL_TEXT_JS = """(minPx) => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, text = node.textContent.trim();
    const el = node.parentElement;
    if (!text || !el || el.closest('style, script, .hoverlayer, .modebar-container, .sr-only')) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const r = [...range.getClientRects()].find(r => r.width > 0 && r.height > 0);
    if (!r || r.bottom <= 0 || r.top >= innerHeight || r.right <= 0 || r.left >= innerWidth) continue;
    const cs = getComputedStyle(el);
    if (cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0 || !el.checkVisibility({opacityProperty: true}))
      continue;
    const size = parseFloat(cs.fontSize);
    if (size < minPx) out.push(`${JSON.stringify(text.slice(0, 40))} at ${size.toFixed(1)} px (${el.tagName.toLowerCase()}.${
      String(el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className).slice(0, 40)})`);
  }
  return out;
}"""

CLIPPED_JS = """() => {
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg, style, script, .race-text, .sr-only') || !el.checkVisibility()) continue;
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.bottom <= 0 || r.top >= innerHeight) continue;
    const cs = getComputedStyle(el);
    const scrolls = v => v === 'auto' || v === 'scroll';
    const wide = el.scrollWidth > el.clientWidth + 1 && cs.overflowX !== 'visible' && !scrolls(cs.overflowX);
    const tall = el.scrollHeight > el.clientHeight + 1 && cs.overflowY !== 'visible' && !scrolls(cs.overflowY);
    if (wide || tall) out.push(`${JSON.stringify(el.textContent.trim().slice(0, 40))} (${el.tagName.toLowerCase()}#${el.id})`);
  }
  // the race lanes show whole lines only: a box of 2 lines exactly, bottom-aligned
  for (const t of document.querySelectorAll('.race-text')) {
    if (!t.checkVisibility()) continue;
    const lines = t.clientHeight / parseFloat(getComputedStyle(t).lineHeight);
    if (Math.abs(lines - Math.round(lines)) > 0.05) out.push(`a race lane shows ${lines.toFixed(2)} lines`);
  }
  return out;
}"""


def _chapter(page, n: int) -> None:
    page.locator("#lesson-text h2", has_text=f"Chapter {n} ·").wait_for(timeout=20_000)
    page.wait_for_timeout(300)
    options = page.locator("#lesson-quiz input[type=radio]")
    if options.count() and options.first.is_visible():
        options.first.click()
        page.locator("#lesson-reveal .reveal").wait_for(timeout=15_000)
    page.locator("#lesson-plot .js-plotly-plot").first.wait_for(timeout=15_000)
    page.wait_for_timeout(1200)


@pytest.mark.parametrize("chapter", [1, 2, 6, 12])
def test_presenter_mode_has_no_small_or_cut_text(url, browser, chapter):
    page = _open(browser, url, 1920, 1080, f"?presenter=1&chapter={chapter}")
    page.wait_for_function("document.body.classList.contains('lesson-presenter')", timeout=15_000)
    _chapter(page, chapter)
    if chapter == 12:
        page.wait_for_function("document.querySelectorAll('#lesson-race .race-lane').length == 3", timeout=15_000)
        page.wait_for_timeout(2000)  # the lanes are writing
    small = page.evaluate(SMALL_TEXT_JS, PRESENTER_MIN_PX)
    assert not small, f"chapter {chapter}: text under {PRESENTER_MIN_PX} px: {small[:8]}"
    cut = page.evaluate(CLIPPED_JS)
    assert not cut, f"chapter {chapter}: text cut: {cut[:8]}"
    page.close()


@pytest.mark.parametrize("chapter", [1, 12])
def test_lesson_at_720p_shows_the_answer_and_play_controls_whole(url, browser, chapter):
    page = _open(browser, url, 1280, 720, f"?chapter={chapter}")
    _chapter(page, chapter)
    if chapter == 12:
        page.wait_for_function("document.querySelectorAll('#lesson-race .race-lane').length == 3", timeout=15_000)
        page.wait_for_timeout(2000)
    if chapter != 12:  # the race chapter's lanes show the answers as they are written
        _in_view(page, "#lesson-tokens .tokens-head")
    play, speed = _in_view(page, "#lesson-play"), _in_view(page, "#lesson-speed")
    assert abs((play["y"] + play["height"] / 2) - (speed["y"] + speed["height"] / 2)) < 30, "speed is not beside Play"
    cut = page.evaluate(CLIPPED_JS)
    assert not cut, f"chapter {chapter} at 1280x720: text cut: {cut[:8]}"
    if chapter == 1:  # nothing named before the lesson introduces it
        legend = page.locator("#lesson-tokens .tokens-head").inner_text()
        assert "active set" not in legend and "vocab miss" not in legend
    page.close()
