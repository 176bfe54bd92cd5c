"""The web page at / in a real browser: Playwright driving Debian's chromium headless
(.ci/run installs it; without it these tests fail unless SLOTSERVE_SKIP_BROWSER=1). The page loads without the API key,
chats with a streamed reply, saves a slot and lists its file, erases and restores it,
and says so clearly when the key is wrong. --no-webui turns it off."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest
from server_proc import InProcessServer
from unavailable import unavailable

KEY = "sesame"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("SLOTSERVE_SCREENSHOT")  # a path: also save a screenshot of the page there


@pytest.fixture(scope="module", autouse=True)
def _browser():
    if CHROMIUM is None:
        unavailable("Debian's chromium is not installed (.ci/run installs it)", "SLOTSERVE_SKIP_BROWSER")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slots = tmp_path_factory.mktemp("webui-slots")
    with InProcessServer(parallel=2, api_key=KEY, slot_save_path=slots) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server.url + "/")
    yield page
    page.close()


def use_key(page, key: str) -> None:
    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")


def test_the_page_and_its_assets_need_no_key_but_the_api_does(server):
    assert httpx.get(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/ui/app.js").status_code == 200
    assert httpx.get(server.url + "/slots").status_code == 401


def test_a_message_gets_a_streamed_reply(page):
    use_key(page, KEY)
    page.wait_for_function("document.querySelector('#model').textContent.includes('slots')")
    page.fill("#prompt", "Write a function")
    page.fill("#max-tokens", "96")
    # streaming: text is already there while the request still runs (Stop enabled). An
    # observer sees every change of the page as it happens, so a fast reply cannot slip
    # between two polls of the condition.
    page.evaluate(
        """() => {
          window.__streamed = false;
          new MutationObserver(() => {
            const reply = document.querySelector('.msg.assistant');
            if (reply && reply.textContent.length > 0 && !document.querySelector('#stop').disabled) {
              window.__streamed = true;
            }
          }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
        }"""
    )
    page.click("#send")
    done = "document.querySelector('#stop').disabled && document.querySelector('.msg.assistant')"
    page.wait_for_function(
        done + " && document.querySelector('.msg.assistant').textContent.includes('tokens')", timeout=60_000
    )
    assert page.evaluate("window.__streamed")
    reply = page.text_content(".msg.assistant")
    assert reply and "tokens" in reply  # the usage line closes the reply
    if SHOTS:
        page.screenshot(path=SHOTS, full_page=True)


def test_a_slot_is_saved_listed_erased_and_restored(page, server):
    use_key(page, KEY)
    page.fill("#chat-slot", "1")
    page.fill("#prompt", "def add(a, b):")
    page.fill("#max-tokens", "8")
    page.click("#send")
    page.wait_for_function("document.querySelector('#stop').disabled && document.querySelector('.msg.assistant')")
    row = page.locator("#slots tr[data-slot='1']")
    row.locator("text=save").wait_for()
    cached = "document.querySelector(\"#slots tr[data-slot='1'] td:nth-child(3)\").textContent"
    page.wait_for_function(f"Number({cached}) > 0")  # the table refreshes on its own clock: wait for it
    n_cached = int(row.locator("td").nth(2).text_content())
    row.locator("input").fill("from-page.slot")
    row.locator("button", has_text="save").click()
    page.locator("#files tr[data-file='from-page.slot']").wait_for()
    assert "this model" in page.text_content("#files tr[data-file='from-page.slot']")
    row.locator("button", has_text="erase").click()
    page.wait_for_function("document.querySelector(\"#slots tr[data-slot='1'] td:nth-child(3)\").textContent === '0'")
    row.locator("button", has_text="restore").click()
    page.wait_for_function(
        f"document.querySelector(\"#slots tr[data-slot='1'] td:nth-child(3)\").textContent === '{n_cached}'"
    )
    assert Path(server.state.settings.slot_save_path, "from-page.slot").is_file()


def test_the_live_view_works_on_a_default_start(page, server):
    """The server runs without --metrics (the default): the live view reads /live."""
    assert httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 501
    before = httpx.get(server.url + "/live", headers={"Authorization": f"Bearer {KEY}"}).json()["generated_tokens"]
    use_key(page, KEY)
    page.fill("#prompt", "def add(a, b):")
    page.fill("#max-tokens", "8")
    page.click("#send")
    page.wait_for_function("document.querySelector('#stop').disabled && document.querySelector('.msg.assistant')")
    page.wait_for_function("document.querySelector('#live-kv').textContent.includes('% of')", timeout=30_000)
    assert page.text_content("#live-running").strip().isdigit()
    assert page.text_content("#live-waiting").strip().isdigit()
    after = httpx.get(server.url + "/live", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert after["generated_tokens"] >= before + 1 and after["cache_bytes_capacity"] > 0
    assert httpx.get(server.url + "/live").status_code == 401  # behind the key, as the API


def test_a_wrong_key_is_a_clear_message(page):
    use_key(page, "not-the-key")
    page.wait_for_selector("#notice:not([hidden])")
    assert "refused the API key" in page.text_content("#notice")


def test_the_web_app_files_load_without_the_key():
    with InProcessServer(parallel=1, api_key="k") as srv:
        for path in ("/", "/sw.js", "/manifest.webmanifest", "/_app/version.json"):
            assert httpx.get(srv.url + path).status_code == 200, path
        assert httpx.get(srv.url + "/manifest.webmanifest").json()["start_url"] == "/"
        assert httpx.get(srv.url + "/props").status_code == 401  # the API still wants it


def test_no_webui_turns_it_off():
    with InProcessServer(parallel=1, webui=False) as srv:
        assert httpx.get(srv.url + "/").status_code == 404
        assert httpx.get(srv.url + "/ui/app.js").status_code == 404


def test_a_text_model_shows_no_image_control(page):
    use_key(page, KEY)
    page.wait_for_function("document.querySelector('#model').textContent.includes('slots')")  # /props read
    assert page.locator("#attach").is_hidden()
