"""Every inspector page at a phone's width (390 px) and a desktop's (1280 px) in a real headless
Chromium: nothing wider than the screen, and no accessibility violation axe-core rates serious or
critical (contrast, names of controls, table semantics, ...).

The memory shown is the hard case: an id with ``/``, ``%`` and dots, Chinese and English facts, a
1,000-character word, markup, a superseded and a deleted fact, summaries, and a dead letter of a
thread whose id is 200 characters long.
"""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from memq.core.settings import MemqSettings
from memq.server.ui.render import path_segment
from memq.testing.waiting import wait_for
from producer import MemoryProducer
from storage import get_storage
from storage.base import Change, UpdateResult
from storage.document import MemoryDocument, SupersededFact
from storage.management import MemoryManager
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.inspector import (
    DESKTOP,
    HOSTILE_FACTS,
    PHONE,
    at_width,
    axe_serious,
    narrowest_px,
    overflow_px,
)
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import stack_settings, turn
from tests.support.serve import Keys
from worker.queue import QueueClient

# Stored text a reader needs whole lines of: at a phone's width each gets most of the screen (the
# old table squeezed a fact into a column two or three letters wide).
READ_WHOLE = ".fact-content, .change-content, .message-excerpt, #dead .reason, #left-out .ut"
pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]
USER = "app1-zoë/team%2Fa.b"
AGENT = "planner.v2"
LONG_THREAD = "thread-" + "x" * 200
FACTS = (
    ("用户在杭州的一家电商公司担任数据工程师，负责实时数仓和推荐系统的特征管道建设", "knowledge"),
    ("Lives in Berlin since March, moved from Munich for a job at Zalando", "context"),
    ("Prefers Rust for services and Python for scripts", "preference"),
    *((text, "context") for text in HOSTILE_FACTS),
)


def seed(settings: MemqSettings) -> tuple[MemoryManager, str, str]:
    """The memory shown, written by hand; returns the manager, a current and a retired fact id."""
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    manager.import_document(
        USER,
        {
            "user": {"workContext": {"summary": "Data engineer at Zalando, " + "流式 " * 80}},
            "history": {"recentMonths": {"summary": "Moved from Munich to Berlin."}},
            "facts": [{"content": "Drinks tea", "confidence": 0.5}],
        },
        agent_name=AGENT,
    )
    ids = [
        manager.add_fact(USER, text, agent_name=AGENT, category=category, confidence=0.8).id
        for text, category in FACTS
    ]
    manager.edit_fact(USER, ids[1], agent_name=AGENT, confidence=0.9)
    gone = manager.add_fact(USER, "Works at Siemens", agent_name=AGENT, confidence=0.6)
    manager.delete_fact(USER, gone.id, agent_name=AGENT)
    old = manager.add_fact(USER, "Lives in Munich", agent_name=AGENT, confidence=0.7)

    def supersede(document: MemoryDocument) -> UpdateResult:
        fact = document.fact(old.id)
        assert fact is not None
        document.facts = [f for f in document.facts if f.id != old.id]
        document.superseded.append(
            SupersededFact(fact=fact, replaced_by=[ids[1]], reason="moved", thread_id=LONG_THREAD)
        )
        change = Change(action="supersede", fact_id=old.id, content=fact.content, reason="moved")
        return UpdateResult(document, [change])

    get_storage(settings).update(USER, AGENT, supersede)
    return manager, ids[0], old.id


def garbage(_request: dict[str, Any]) -> Reply:
    return Reply(content="I think the user likes cats, probably.")


@pytest.mark.timeout(600)  # 48 pages, each laid out and checked by axe, on a shared machine
def test_every_page_fits_a_phone_and_a_desktop_and_passes_axe(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
    redis_client: Any,
    browser: WebDriver,
) -> None:
    openai_server.responder = garbage
    settings = stack_settings(make_settings, openai_server, max_attempts=1)
    env = memq_env(settings)
    celery_procs.start_worker(env)
    celery_procs.start_beat(env)
    _manager, fact_id, retired_id = seed(settings)
    with MemoryProducer(settings) as producer:
        producer.enqueue(LONG_THREAD, USER, AGENT, turn("a conversation that dies"), flush=True)
    queue = QueueClient(settings, redis_client)
    wait_for(lambda: queue.dead_list(), what="the thread dead")
    server = serve_for(settings)

    ui = server.url + "/ui"
    user = f"{ui}/users/{path_segment(USER)}"
    agent = f"agent={path_segment(AGENT)}"
    pages = {
        "users": f"{ui}/users",
        "user": user,
        "facts": f"{user}/memory?{agent}",
        "summaries": f"{user}/memory?{agent}&tab=summaries",
        "superseded": f"{user}/memory?{agent}&tab=superseded",
        "history": f"{user}/memory?{agent}&tab=history",
        "fact": f"{user}/facts/{fact_id}?{agent}",
        "retired fact": f"{user}/facts/{retired_id}?{agent}",
        "preview": f"{user}/preview?{agent}",
        "every memory": f"{user}/all",
        "every memory searched": f"{user}/all?text=%E6%9D%AD%E5%B7%9E%20Berlin",
        "export and import": f"{user}/memory?{agent}&tab=transfer",
        "queue": f"{ui}/queue",
        "not found": f"{user}/facts/no-such-fact?{agent}",
        "no such page": f"{ui}/no/such/page",
    }
    failures: list[str] = []

    def check(name: str, size: tuple[int, int]) -> None:
        wide = overflow_px(browser)
        if wide > 0:
            failures.append(f"{name} at {size[0]} px: {wide} px wider than the screen")
        failures.extend(f"{name} at {size[0]} px: {v}" for v in axe_serious(browser))
        narrowest = narrowest_px(browser, READ_WHOLE)
        if narrowest is not None and narrowest < min(size[0] // 2, 400):
            failures.append(f"{name} at {size[0]} px: stored text in a {narrowest} px column")

    # English at both widths, then every page again in Chinese on the phone (the language switch).
    for size, lang in ((PHONE, "en"), (DESKTOP, "en"), (PHONE, "zh-Hans")):
        at_width(browser, size)
        browser.get(ui + "/logout-nowhere")  # any page: the login page comes first
        browser.get(ui + "/login")
        check("login", size)
        browser.find_element(By.ID, "key").send_keys(Keys().admin)
        browser.find_element(By.ID, "login").click()
        wait_for(lambda: browser.current_url.endswith("/ui/users"), what="logged in")
        if lang != "en":
            browser.find_element(By.ID, f"lang-{lang}").click()
            wait_for(
                lambda want=lang: (
                    browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == want
                ),
                what="the Chinese pages",
            )
            assert browser.find_element(By.CSS_SELECTOR, "header nav a").text == "用户"
        for name, url in pages.items():
            browser.get(url)
            check(name, size)
        browser.get(pages["preview"])
        browser.find_element(By.ID, "query").send_keys("杭州 工作")
        browser.find_element(By.ID, "preview-button").click()
        wait_for(lambda: browser.find_elements(By.ID, "token-count"), what="the preview")
        check("preview result", size)
        browser.delete_all_cookies()
    assert not failures, "\n".join(failures)


def test_a_thousand_fact_memory_is_paged_in_the_browser(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings(max_facts=1000)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    facts = [
        {"id": f"f{n:04d}", "content": f"Fact number {n} about 项目 {n % 37}", "confidence": 0.5}
        for n in range(1000)
    ]
    manager.import_document(USER, {"facts": facts}, agent_name=AGENT)
    server = serve_for(settings)
    at_width(browser, PHONE)
    browser.get(server.url + "/ui/login")
    browser.find_element(By.ID, "key").send_keys(Keys().admin)
    browser.find_element(By.ID, "login").click()
    wait_for(lambda: browser.current_url.endswith("/ui/users"), what="logged in")
    browser.get(f"{server.url}/ui/users/{path_segment(USER)}/memory?agent={path_segment(AGENT)}")
    seen: list[str] = []
    sizes: list[int] = []
    for _ in range(25):
        rows = browser.find_elements(By.CSS_SELECTOR, "#facts tbody tr[data-fact-id]")
        seen += [str(r.get_attribute("data-fact-id")) for r in rows]
        sizes.append(
            int(
                browser.execute_script(
                    "return performance.getEntriesByType('navigation')[0].decodedBodySize"
                )
            )
        )
        assert overflow_px(browser) <= 0
        following = browser.find_elements(By.ID, "next-page")
        if not following:
            break
        old = browser.find_element(By.TAG_NAME, "html")
        following[0].click()
        WebDriverWait(browser, 10).until(expected_conditions.staleness_of(old))
    assert sorted(seen) == [f["id"] for f in facts]  # every fact once, none twice
    assert len(sizes) == 20 and max(sizes) <= 60_000
    assert browser.find_element(By.ID, "page-position").text.endswith("of 1000")
