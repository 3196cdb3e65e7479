"""The inspector in a real headless Chromium against a real `memq serve`, Redis, Celery worker and
beat, extracting with the real `openai` client from the scripted server: what an operator does,
click by click, and what a hostile fact can do to the page (nothing)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from memq.core.settings import MemqSettings
from memq.server.ui.render import path_segment
from memq.testing.openai_server import CitingModel, Teach
from memq.testing.waiting import wait_for
from producer import MemoryProducer
from storage import get_storage
from storage.base import UpdateResult
from storage.document import MemoryDocument, SupersededFact
from storage.management import MemoryManager
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.inspector import (
    HOSTILE_FACTS,
    by_id,
    console_errors,
    log_in,
    navigate,
    no_alert,
    text_of,
)
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import conversation_of, fact_for, stack_settings, turn
from tests.support.serve import Keys
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]
POISON = "item-99"
GUS = "app1-gus@example.com"  # real ids: an e-mail, a provider subject with a tenant path
EVE = "app1-eve|auth0/x"


class PoisonModel:
    """Learns every item, citing the user's message that names it, but answers garbage for a
    conversation about ``POISON`` until healed."""

    def __init__(self) -> None:
        self.healthy = threading.Event()
        items = ("item-1", "item-2", POISON)
        self.citing = CitingModel([Teach(fact_for(i), said=i, role="user") for i in items])

    def __call__(self, request: dict[str, Any]) -> Reply:
        if POISON in conversation_of(request) and not self.healthy.is_set():
            return Reply(content="I think the user likes cats, probably.")
        return self.citing(request)


def test_an_operator_finds_questions_corrects_previews_and_repairs_in_the_browser(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
    redis_client: Any,
    browser: WebDriver,
) -> None:
    model = PoisonModel()
    openai_server.responder = model
    settings: MemqSettings = stack_settings(make_settings, openai_server, max_attempts=1)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    server = serve_for(settings)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    queue = QueueClient(settings, redis_client)
    with MemoryProducer(settings) as producer:
        producer.enqueue("trip-1", GUS, None, turn("item-1", "I sail."), flush=True)
        producer.enqueue("trip-2", GUS, None, turn("item-2"), flush=True)
        producer.enqueue("poison-1", GUS, None, turn(POISON), flush=True)
    wait_for(
        lambda: len(manager.list_facts(GUS)) == 2 and queue.dead_list(),
        what="two facts learnt and the poisoned thread dead",
    )

    # Log in; find the user by a prefix of their id.
    log_in(browser, server.url, Keys().admin)
    by_id(browser, "prefix").send_keys("app1-g")
    navigate(browser, by_id(browser, "find-user").submit)
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#users a")] == [GUS]
    navigate(browser, browser.find_element(By.LINK_TEXT, GUS).click)
    facts_cell = browser.find_element(By.CSS_SELECTOR, "#agents [data-facts]")
    assert text_of(facts_cell) == "2"
    navigate(browser, browser.find_element(By.CSS_SELECTOR, "#agents a").click)

    # Open a fact: it says where it came from, down to the message the user wrote.
    rows = browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr")
    assert sorted(text_of(r.find_element(By.CLASS_NAME, "fact-content")) for r in rows) == [
        fact_for("item-1"),
        fact_for("item-2"),
    ]
    navigate(browser, browser.find_element(By.LINK_TEXT, fact_for("item-1")).click)
    assert text_of(by_id(browser, "fact-content")) == fact_for("item-1")
    threads = [text_of(c) for c in browser.find_elements(By.CSS_SELECTOR, "#provenance .ut")]
    assert "trip-1" in threads
    (quoted,) = browser.find_elements(By.CSS_SELECTOR, "#provenance .message-excerpt")
    assert text_of(quoted) == turn("item-1", "I sail.")[0]["content"]
    history = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in history] == ["add"]

    # Edit it: the change shows in its history, marked as by hand.
    content = by_id(browser, "edit-content")
    content.clear()
    content.send_keys("The user owns item-1, a red dinghy")
    navigate(browser, by_id(browser, "save-fact").click)
    assert "edited" in by_id(browser, "notice").text
    assert text_of(by_id(browser, "fact-content")) == "The user owns item-1, a red dinghy"
    first = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")[0]
    cells = first.find_elements(By.TAG_NAME, "td")
    assert (
        cells[1].text == "edit"
        and "red dinghy" in cells[2].text
        and cells[4].text == "by hand (ops)"
    )

    # Delete it (the browser asks first).
    navigate(browser, by_id(browser, "delete-fact-button").click, alert=True)
    assert "deleted" in by_id(browser, "notice").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr .fact-content")
    assert [text_of(r) for r in rows] == [fact_for("item-2")]
    assert [f.content for f in manager.list_facts(GUS)] == [fact_for("item-2")]

    # Preview the block an agent would get for a query.
    navigate(browser, by_id(browser, "tab-preview").click)
    by_id(browser, "query").send_keys("what do I own?")
    budget = by_id(browser, "budget")
    budget.clear()
    budget.send_keys("300")
    navigate(browser, by_id(browser, "preview-button").click)
    block = text_of(by_id(browser, "block"))
    assert block.startswith("<user_memory>") and fact_for("item-2") in block
    assert int(text_of(by_id(browser, "token-count")).split()[0]) > 0

    # Forget a thread: the fact learnt only from it is gone from the page and the memory.
    # From the user's thread list, which says what each thread taught; a preview of exactly
    # what will go; then it is gone.
    browser.get(f"{server.url}/ui/users/{path_segment(GUS)}")
    row = browser.find_element(By.CSS_SELECTOR, '#threads tr[data-thread="trip-2"]')
    assert [text_of(t) for t in row.find_elements(By.CLASS_NAME, "taught")] == [fact_for("item-2")]
    navigate(browser, row.find_element(By.CLASS_NAME, "forget-thread").click)
    going = browser.find_elements(By.CSS_SELECTOR, ".will-go .going")
    assert [text_of(g) for g in going] == [fact_for("item-2")]
    navigate(browser, by_id(browser, "forget-thread-button").click)
    assert "Thread forgotten" in by_id(browser, "notice").text
    assert browser.find_elements(By.CSS_SELECTOR, '#threads tr[data-thread="trip-2"]') == []
    # A thread memq never saw is said to be unknown, before and after.
    browser.get(f"{server.url}/ui/users/{path_segment(GUS)}/thread?id=no-such-thread")
    assert by_id(browser, "thread-unknown").is_displayed()
    navigate(browser, by_id(browser, "forget-thread-button").click)
    assert "Unknown thread" in by_id(browser, "notice").text
    assert manager.list_facts(GUS) == []
    assert "item-2" not in str(manager.history(GUS))  # the thread's runs left no trace

    # The queue: the dead letter with its reason; retry it once the model is healthy.
    navigate(browser, browser.find_element(By.LINK_TEXT, "Queue").click)
    dead = browser.find_elements(By.CSS_SELECTOR, "#dead tbody tr[data-context]")
    assert len(dead) == 1
    user_cell = dead[0].find_element(By.CLASS_NAME, "user-cell")
    assert [user_cell.text, dead[0].find_element(By.CLASS_NAME, "thread-cell").text] == [
        GUS,
        "poison-1",
    ]
    assert dead[0].find_element(By.CLASS_NAME, "reason").text.strip()
    wait_for(
        lambda: by_id(browser, "live").text.startswith("(live"),
        what="the queue figures refreshed by the page's script",
    )
    model.healthy.set()
    navigate(browser, dead[0].find_element(By.CLASS_NAME, "retry").click)
    assert "1 dead letter retried" in by_id(browser, "notice").text
    wait_for(
        lambda: fact_for(POISON) in [f.content for f in manager.list_facts(GUS)],
        what="the retried thread extracted",
    )
    browser.get(server.url + "/ui/queue")
    assert browser.find_elements(By.CSS_SELECTOR, "#dead tbody tr[data-context]") == []

    # Log out: the pages want a login again.
    navigate(browser, by_id(browser, "logout").click)
    assert browser.current_url.endswith("/ui/login")
    browser.get(f"{server.url}/ui/users/{path_segment(GUS)}/memory")
    assert browser.current_url.endswith("/ui/login")
    assert console_errors(browser) == []


def test_a_hostile_fact_renders_as_text_and_runs_nothing(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings()
    server = serve_for(settings)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    stored = {manager.add_fact(EVE, t, confidence=0.7).id: t for t in HOSTILE_FACTS}
    log_in(browser, server.url, Keys().admin)
    browser.get(f"{server.url}/ui/users/{path_segment(EVE)}/memory")
    assert no_alert(browser)
    shown = {
        row.get_attribute("data-fact-id"): text_of(row.find_element(By.CLASS_NAME, "fact-content"))
        for row in browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr")
    }
    assert shown == stored
    assert browser.find_elements(By.CSS_SELECTOR, "#facts img, #facts svg, #facts script") == []
    for fact_id, text in stored.items():
        browser.get(f"{server.url}/ui/users/{path_segment(EVE)}/facts/{fact_id}")
        assert no_alert(browser)
        assert text_of(browser.find_element(By.CSS_SELECTOR, "#fact-content .ut")) == text
        assert by_id(browser, "edit-content").get_property("value") == text
    browser.get(f"{server.url}/ui/users/{path_segment(EVE)}/preview")
    navigate(browser, by_id(browser, "preview-button").click)
    assert no_alert(browser)
    block = text_of(by_id(browser, "block"))
    assert block.startswith("<user_memory>") and block.count("</user_memory>") == 1
    assert browser.execute_script("return typeof window.xss") == "undefined"
    assert console_errors(browser) == []


def test_a_change_without_the_csrf_token_is_refused_in_the_browser(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings()
    server = serve_for(settings)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    fact = manager.add_fact("app1-ivy", "The user reads maps", confidence=0.8)
    log_in(browser, server.url, Keys().admin)
    browser.get(f"{server.url}/ui/users/app1-ivy/facts/{fact.id}")
    # A forged form: the same fields, no token (what another site's page could post).
    browser.execute_script("document.querySelector('#edit-fact input[name=csrf_token]').remove();")
    content = by_id(browser, "edit-content")
    content.clear()
    content.send_keys("The user burns maps")
    navigate(browser, by_id(browser, "save-fact").click)
    assert "CSRF" in by_id(browser, "error-message").text
    assert [f.content for f in manager.list_facts("app1-ivy")] == ["The user reads maps"]
    assert [c.action for c in manager.history("app1-ivy")] == ["add"]


def test_an_edit_shows_its_diff_and_deleted_or_superseded_facts_come_back(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings()
    server = serve_for(settings)
    storage = get_storage(settings)
    manager = MemoryManager(storage, max_facts=settings.max_facts)
    manager.import_document(
        GUS,
        {
            "facts": [
                {
                    "id": "f.siemens%2F1",  # a dot and a literal %2F, addressed exactly
                    "content": "Works at Siemens",
                    "category": "knowledge",
                    "confidence": 0.8,
                    "sources": [{"thread_id": "chat-7", "attribution": "message"}],
                },
                {"id": "f-munich", "content": "Lives in Munich", "confidence": 0.7},
                {"id": "f-berlin", "content": "Lives in Berlin", "confidence": 0.9},
            ]
        },
    )

    def supersede(document: MemoryDocument) -> UpdateResult:
        fact = document.fact("f-munich")
        assert fact is not None
        document.facts = [f for f in document.facts if f.id != "f-munich"]
        entry = SupersededFact(fact=fact, replaced_by=["f-berlin"], reason="moved")
        document.superseded.append(entry)
        return UpdateResult(document, [])

    storage.update(GUS, None, supersede)
    log_in(browser, server.url, Keys().admin)
    user = f"{server.url}/ui/users/{path_segment(GUS)}"

    # Correct Siemens → Zalando: the history says exactly that, by whom; the old sources stay.
    browser.get(f"{user}/facts/{path_segment('f.siemens%2F1')}")
    content = by_id(browser, "edit-content")
    content.clear()
    content.send_keys("Works at Zalando")
    navigate(browser, by_id(browser, "save-fact").click)
    diff = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")[0]
    (field,) = diff.find_elements(By.CSS_SELECTOR, "ul.diff li")
    assert field.get_attribute("data-field") == "content"
    assert text_of(field.find_element(By.TAG_NAME, "del")) == "Works at Siemens"
    assert text_of(field.find_element(By.TAG_NAME, "ins")) == "Works at Zalando"
    assert "ops" in text_of(diff.find_element(By.CLASS_NAME, "by-hand"))  # the admin key's name
    edited = text_of(by_id(browser, "edited-by-hand"))
    assert "ops" in edited and "Works at Siemens" in edited
    assert "chat-7" in text_of(by_id(browser, "provenance"))

    # Delete it: its page still answers, says so, and restores it whole.
    navigate(browser, by_id(browser, "delete-fact-button").click, alert=True)
    browser.get(f"{user}/facts/{path_segment('f.siemens%2F1')}")
    assert "Deleted by hand" in text_of(by_id(browser, "deleted"))
    navigate(browser, by_id(browser, "restore-fact-button").click)
    assert "restored" in by_id(browser, "notice").text
    back = manager.document(GUS).fact("f.siemens%2F1")
    assert back is not None and back.content == "Works at Zalando"
    assert [s.thread_id for s in back.sources] == ["chat-7"]

    # The superseded fact, from the superseded tab: restored too.
    browser.get(f"{user}/memory?tab=superseded")
    navigate(browser, browser.find_element(By.LINK_TEXT, "Lives in Munich").click)
    assert by_id(browser, "retired").is_displayed()
    navigate(browser, by_id(browser, "restore-fact-button").click)
    document = manager.document(GUS)
    assert document.fact("f-munich") is not None and document.superseded == []
    assert [c.action for c in manager.history(GUS)[:2]] == ["restore", "restore"]
    assert console_errors(browser) == []


def test_corrections_stick_a_summary_edit_and_a_fact_never_learnt_again_by_a_real_worker(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
    browser: WebDriver,
) -> None:
    siemens = "The user works at Siemens"
    openai_server.responder = CitingModel(
        [
            Teach(siemens, said="Siemens", role="user"),
            *(Teach(fact_for(i), said=i, role="user") for i in ("item-1", "item-2")),
        ]
    )
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env)
    celery_procs.start_beat(env)
    server = serve_for(settings)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    manager.import_document(
        GUS,
        {
            "user": {"workContext": {"summary": "Data engineer at Siemens"}},
            "facts": [{"content": "Drinks tea", "confidence": 0.5}],
        },
    )
    with MemoryProducer(settings) as producer:
        producer.enqueue("job-1", GUS, None, turn("item-1", "I work at Siemens."), flush=True)
    wait_for(
        lambda: {siemens, fact_for("item-1")} <= {f.content for f in manager.list_facts(GUS)},
        what="the first thread learnt",
    )
    log_in(browser, server.url, Keys().admin)
    user = f"{server.url}/ui/users/{path_segment(GUS)}"

    # The summary, corrected by hand, is what the next agent gets.
    browser.get(f"{user}/memory?tab=summaries")
    summary = by_id(browser, "summary-text-work_context")
    summary.clear()
    summary.send_keys("Data engineer at Zalando")
    navigate(browser, by_id(browser, "save-summary-work_context").click)
    assert "Summary edited" in by_id(browser, "notice").text
    (change,) = [c for c in manager.history(GUS) if c.action == "summary"]
    assert change.by == "ops" and [(f.old, f.new) for f in change.changed or []] == [
        ("Data engineer at Siemens", "Data engineer at Zalando")
    ]
    browser.get(f"{user}/preview")
    navigate(browser, by_id(browser, "preview-button").click)
    block = text_of(by_id(browser, "block"))
    work = [line for line in block.splitlines() if line.startswith("- Work:")]
    assert work == ["- Work: Data engineer at Zalando"]

    # Forget the Siemens fact for good, from its page.
    fact_id = next(f.id for f in manager.list_facts(GUS) if f.content == siemens)
    browser.get(f"{user}/facts/{path_segment(fact_id)}")
    navigate(browser, by_id(browser, "forget-fact-button").click, alert=True)
    listed = browser.find_elements(By.CSS_SELECTOR, "#do-not-learn .blocked-content")
    assert [text_of(e) for e in listed] == [siemens]

    # A new thread says it again: the real worker learns the rest of it, but not that.
    asked = openai_server.call_count
    with MemoryProducer(settings) as producer:
        producer.enqueue("job-2", GUS, None, turn("item-2", "Still at Siemens!"), flush=True)
    wait_for(
        lambda: fact_for("item-2") in {f.content for f in manager.list_facts(GUS)},
        what="the second thread learnt",
    )
    assert siemens not in {f.content for f in manager.list_facts(GUS)}
    prompt = openai_server.prompts()[asked]
    assert "<do_not_learn>" in prompt and siemens in prompt.split("<do_not_learn>")[1]

    # The list is editable: allowed again, the next thread may teach it.
    browser.get(f"{user}/memory?tab=do-not-learn")
    navigate(browser, browser.find_element(By.CSS_SELECTOR, "#do-not-learn .unblock").click)
    assert manager.document(GUS).do_not_learn == []
    assert console_errors(browser) == []


def test_a_user_whose_id_ends_like_a_route_gets_its_own_pages_in_the_browser(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    """Users ``x`` and ``x/memory`` (and ``slack/C1``): each page shows exactly its own user's
    facts — the page of ``x/memory`` once showed user ``x``."""
    settings: MemqSettings = make_settings()
    server = serve_for(settings)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    users = {"x": "Lives in Porto.", "x/memory": "Lives in Oslo.", "slack/C1": "Lives in Graz."}
    for user, fact in users.items():
        manager.add_fact(user, fact, confidence=0.8)
    log_in(browser, server.url, Keys().admin)
    for user, fact in users.items():
        browser.get(f"{server.url}/ui/users/{path_segment(user)}/memory")
        shown = [
            text_of(row.find_element(By.CLASS_NAME, "fact-content"))
            for row in browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr")
        ]
        assert shown == [fact], (user, shown)
        assert user in text_of(browser.find_element(By.TAG_NAME, "h1")), user
    assert console_errors(browser) == []
