"""The browser app in a real browser (headless Chromium, see browser.py) against real
servers: the Chat page streams an answer, regenerates it from the conversation cache, stops,
edits and resends, and shows model output that is HTML as text; the Monitor's grid shows a
long prompt's chunks while it is read and their disappearance when it is evicted.

Two servers: the default model (bfloat16, a pool of 32 chunks of 16 cells, an API key, prompt
pieces of 8 tokens so a long prompt takes many steps) and a scripted tiny model whose answer
is fixed hostile HTML (scripted_model.py). The page runs under its strict Content-Security-Policy
(browser.py: enforced, and every test asserts no violation). No assertion reads the clock: the
page is watched with playwright's waits, which poll every animation frame, and where a test
must see a passing state (a prompt being read) the engine's steps wait at a gate
(step_gate.py) until the page has shown it.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from browser import BrowserSession, artifacts_dir, problems
from scripted_model import make_scripted_model
from serving import RunningServer, engine_loader, start_server
from step_gate import StepGate

from strata.server.settings import ServerSettings

KEY = "browser-key"
HOSTILE = "<img src onerror=alert(1)> <script>"
ENGINE = {"dtype": "bfloat16", "max_context": 400, "batch": 1, "kv_pool_tokens": 512, "kv_chunk": 16,
          "prefill_chunk": 8}


@pytest.fixture(scope="module")
def session():
    s = BrowserSession()
    yield s
    s.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return artifacts_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def server(gguf_path):
    running = start_server(ServerSettings(api_key=KEY, model_alias="smol"),
                           engine_loader(gguf_path, gate=StepGate(), **ENGINE))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory, smol_tokenizer):
    model = make_scripted_model(str(tmp_path_factory.mktemp("scripted")), smol_tokenizer, HOSTILE)
    running = start_server(ServerSettings(model_alias="scripted"), engine_loader(model, dtype="float32",
                                                                                max_context=1024, batch=1))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def context(session, server):
    """A browser profile that has given the page the key once (the first test does)."""
    ctx = session.new_context()
    yield ctx
    ctx.close()


def until(page, expression: str) -> None:
    """Waits until `expression` is true in the page. Passed as a function: playwright compiles
    that over the devtools protocol, while a bare string would be polled through `eval`, which
    the page's Content-Security-Policy (no 'unsafe-eval') forbids."""
    page.wait_for_function(f"() => ({expression})")


def open_app(page, url: str) -> None:
    """Opens the page; gives it the key if this browser profile has not yet."""
    page.goto(url)
    until(page, "document.getElementById('model-name').textContent || document.getElementById('key-dialog').open")
    if page.is_visible("#key-dialog"):
        page.fill("#key-input", KEY)
        page.click("#key-save")
    until(page, "document.getElementById('model-name').textContent === 'smol'")


def settings(page, max_tokens: int, temperature: float = 0.0) -> None:
    page.evaluate("document.getElementById('settings').open = true")
    page.fill("#max-tokens", str(max_tokens))
    page.dispatch_event("#max-tokens", "change")
    page.fill("#temperature", str(temperature))
    page.dispatch_event("#temperature", "change")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.click("#send")


def answer_count(page) -> int:
    return page.locator(".message.assistant .cost").count()


def wait_answers(page, n: int):
    until(page, f"document.querySelectorAll('.message.assistant .cost').length >= {n}")
    return page.locator(".message.assistant .cost").nth(n - 1)


def count_paints(page) -> None:
    """Counts the distinct texts the streaming answer shows (window.paints)."""
    page.evaluate("""() => {
      window.paints = new Set();
      new MutationObserver(() => {
        const node = document.querySelector('.message.assistant.streaming .content');
        if (node && node.textContent) window.paints.add(node.textContent);
      }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")


def test_chat_streams_regenerates_from_the_cache_and_remembers_the_key(session, server, context, shots):
    page = session.new_page(context)
    page.goto(server.base_url + "/")
    page.wait_for_selector("#key-dialog[open]")  # --api-key: the page asks once
    page.fill("#key-input", KEY)
    page.click("#key-save")
    until(page, "document.getElementById('model-name').textContent === 'smol'")
    settings(page, max_tokens=8)
    count_paints(page)
    send(page, "Name three colours.")
    first = wait_answers(page, 1)
    assert page.evaluate("window.paints.size") >= 2, "the answer appeared at once, not streamed"
    answer = page.locator(".message.assistant .content").inner_text()
    assert answer.strip()
    prompt = int(first.get_attribute("data-prompt"))
    assert prompt > 0 and int(first.get_attribute("data-cached")) < prompt
    assert "TTFT" in first.inner_text() and "tok/s" in first.inner_text()
    page.screenshot(path=str(shots / "chat.png"))
    assert problems(page) == []

    page.click(".message.assistant .regenerate")
    regenerated = wait_answers(page, 1)  # the old answer was replaced by the new one
    until(page, "!document.querySelector('.message.streaming')")
    # The same history again: everything but the token that gives the logits comes from the
    # cached conversation, which keeps the first answer as a branch.
    assert int(regenerated.get_attribute("data-prompt")) == prompt
    assert int(regenerated.get_attribute("data-cached")) == prompt - 1
    assert page.locator(".message").count() == 2
    assert problems(page) == []

    page.reload()
    until(page, "document.getElementById('model-name').textContent === 'smol'")
    assert not page.is_visible("#key-dialog")  # the key is remembered
    assert page.locator("#conversations li").count() == 1
    assert page.locator(".message.user .content").inner_text() == "Name three colours."
    assert problems(page) == []


def test_edit_and_resend_and_stop(session, server, context):
    page = session.new_page(context)
    open_app(page, server.base_url + "/")
    page.click("#new-chat")
    settings(page, max_tokens=8)
    send(page, "Say hello.")
    wait_answers(page, 1)
    page.click(".message.user .edit")
    page.fill(".message.user textarea.editing", "Say goodbye.")
    page.click(".message.user .resend")
    edited = wait_answers(page, 1)
    until(page, "!document.querySelector('.message.streaming')")
    assert page.locator(".message.user .content").inner_text() == "Say goodbye."
    assert page.locator(".message").count() == 2
    assert int(edited.get_attribute("data-cached")) > 0  # the shared start (the default system prompt)

    finished_before = aborted(server)
    settings(page, max_tokens=300, temperature=1.0)  # within --max-context 400
    send(page, "Write a long story about the sea.")
    until(page, "(document.querySelector('.message.assistant.streaming .content') || {}).textContent")
    page.click("#stop")
    until(page, "!document.querySelector('.message.streaming')")
    assert "stopped" in page.locator(".message.assistant").last.inner_text()
    server.wait_until(lambda m: aborted_in(m) == finished_before + 1)  # the server freed the request
    server.wait_until(lambda m: m.get("strata_requests_running", 0) == 0)
    assert problems(page) == []


def aborted_in(m: dict[str, float]) -> float:
    return m.get('strata_requests_finished_total{finish_reason="abort"}', 0.0)


def aborted(server: RunningServer) -> float:
    return aborted_in(server.metrics())


def test_model_output_that_is_html_is_shown_as_text(session, scripted_server, shots):
    page = session.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(scripted_server.base_url + "/")
    send(page, "Show me something.")
    wait_answers(page, 1)
    content = page.locator(".message.assistant .content")
    assert content.inner_text() == HOSTILE  # the model's text, character for character
    assert page.locator("#messages img, #messages script").count() == 0
    assert problems(page) == []

    # A stored answer with Markdown around HTML renders the Markdown and shows the HTML as text.
    stored = [{"id": "cx", "title": "x", "system": "", "updated": 1, "messages": [
        {"role": "user", "content": "<b>hi</b>"},
        {"role": "assistant", "content": "**bold** <img src=x onerror=alert(2)>\n```html\n<script>alert(3)</script>\n```"},
    ]}]
    page.evaluate("s => localStorage.setItem('strata.conversations', s)", json.dumps(stored))
    page.reload()
    page.wait_for_selector(".message.assistant pre.code")
    assert page.locator(".message.assistant strong").inner_text() == "bold"
    assert page.locator(".message.assistant pre.code code").inner_text() == "<script>alert(3)</script>"
    assert "<img src=x onerror=alert(2)>" in page.locator(".message.assistant .content").inner_text()
    assert page.locator(".message.user .content").inner_text() == "<b>hi</b>"
    assert page.locator("#messages img, #messages script, #messages b").count() == 0
    page.screenshot(path=str(shots / "chat-html-as-text.png"))
    assert dialogs == [] and problems(page) == []


def stream_ids(server: RunningServer, ids: list[int], done: threading.Event) -> threading.Thread:
    def run() -> None:
        body = {"prompt": ids, "max_tokens": 2, "temperature": 0, "stream": True}
        with httpx.Client(base_url=server.base_url, headers=server.headers, timeout=300) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    pass
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def chunk_count(page, conv: str, state: str | None = None) -> int:
    selector = f"#grid .chunk[data-conv='{conv}']" + (f"[data-state='{state}']" if state else "")
    return page.locator(selector).count()


def test_monitor_grid_shows_a_long_prompt_being_read_then_evicted(session, server, context, shots):
    page = session.new_page(context)
    open_app(page, server.base_url + "/#monitor")
    page.wait_for_selector("#grid .chunk")  # the first picture arrived (the key is sent)
    # Two prompts with the same 32 first ids: the second branches from the first, sharing
    # its two full chunks, which the grid marks (coloured by the older conversation).
    with httpx.Client(base_url=server.base_url, headers=server.headers, timeout=300) as c:
        for tail in ([1, 2], [3, 4]):
            body = {"prompt": list(range(5000, 5032)) + tail, "max_tokens": 1, "temperature": 0}
            assert c.post("/v1/completions", json=body).status_code == 200
    until(page, """[...document.querySelectorAll('#parked li')]
        .filter(li => li.textContent.includes(' 34 cells · 3 chunks')).map(li => li.dataset.conv)
        .some(c => document.querySelectorAll(`#grid .chunk.shared[data-conv='${c}']`).length === 2)""")
    long_a = list(range(1000, 1300))  # 300 ids: 19 chunks of 16 cells with its first token
    done_a = threading.Event()
    gate = server.gate
    gate.hold()  # the prompt is read only as far as the gate allows: the page sees it mid-way
    try:
        stream_ids(server, long_a, done_a)
        first = gate.steps
        gate.allow(2)  # admission and two pieces of 8 tokens (of 38)
        gate.wait_steps(first + 2)
        # Its lane says prefill and the grid already holds its chunks (room is taken at
        # admission; the fill grows as it is read).
        row = page.wait_for_selector("#lanes tr[data-state='prefill']")
        conv_a = row.get_attribute("data-conv")
        until(page, f"document.querySelectorAll(\"#grid .chunk[data-conv='{conv_a}'][data-state='active']\").length > 0")
        read = int(row.query_selector("td:nth-child(4)").inner_text())
        assert 0 < read < len(long_a)
        gate.allow(1)  # one more piece: the next frames show more of it read
        until(page,
            f"[...document.querySelectorAll(\"#lanes tr[data-conv='{conv_a}'] td:nth-child(4)\")].some(td => +td.textContent > {read})"
        )
        page.screenshot(path=str(shots / "monitor-prefill.png"))
    finally:
        gate.release()
    assert done_a.wait(300)
    until(page, f"document.querySelectorAll(\"#grid .chunk[data-conv='{conv_a}'][data-state='parked']\").length === 19")
    assert page.locator(f"#parked li[data-conv='{conv_a}']").count() == 1

    # Another 300-id prompt needs 19 chunks: with A's 19 held, only 13 exist besides them,
    # so A (parked) gives way, and its cells leave the grid.
    done_b = threading.Event()
    stream_ids(server, list(range(3000, 3300)), done_b)
    until(page, f"document.querySelectorAll(\"#grid .chunk[data-conv='{conv_a}']\").length === 0")
    event = page.wait_for_selector(f"#events li[data-kind='eviction']:has-text('#{conv_a}')")
    assert event is not None
    assert page.locator(f"#parked li[data-conv='{conv_a}']").count() == 0
    assert done_b.wait(300)
    until(page, "document.querySelectorAll('#lanes tr[data-state=\"prefill\"], #lanes tr[data-state=\"decode\"]').length === 0")
    page.screenshot(path=str(shots / "monitor-evicted.png"))
    assert problems(page) == []
