"""The inspector's second-day tools in a real headless Chromium against a real `memq serve` and
Redis: dead letters retried and purged a chosen few at a time, every memory of a user in one
view, export and import, error pages inside the layout, and the preview's left-out list.

Each page it visits is also laid out at a phone's width and a desktop's and checked by axe-core.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from memq.core.settings import MemqSettings
from memq.operations.access import OPEN_ACCESS
from memq.operations.service import MemqService
from memq.server.ui.render import path_segment
from memq.testing.waiting import wait_for
from producer import MemoryProducer
from storage import get_storage
from storage.management import MemoryManager
from tests.support.inspector import (
    DESKTOP,
    PHONE,
    at_width,
    axe_serious,
    by_id,
    console_errors,
    log_in,
    navigate,
    overflow_px,
)
from tests.support.scenarios import turn
from tests.support.serve import Keys, bearer
from tests.support.started_queue import StartingQueue
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]
USER = "app1-zoë/team%2Fa.b"
AGENT = "planner.v2"


def fits_and_passes_axe(driver: WebDriver, name: str) -> list[str]:
    """The current page at a phone's and a desktop's width: what overflows, what axe rejects."""
    failures: list[str] = []
    for size in (PHONE, DESKTOP):
        at_width(driver, size)
        wide = overflow_px(driver)
        if wide > 0:
            failures.append(f"{name} at {size[0]} px: {wide} px wider than the screen")
        failures += [f"{name} at {size[0]} px: {v}" for v in axe_serious(driver)]
    return failures


def dead_letters(settings: MemqSettings, redis_client: Any, users: list[str]) -> QueueClient:
    """One dead letter per user: their conversation claimed and failed for good by the queue's
    own scripts (what a worker does with an answer that is not JSON)."""
    with MemoryProducer(settings) as producer:
        for n, user in enumerate(users):
            producer.enqueue(f"thread-{n}", user, None, turn(f"conversation {n}"), flush=True)
    queue = StartingQueue(settings, redis_client)
    for claim in queue.claim(limit=len(users) * 2).claims:
        queue.fail(claim.context_id, claim.token, "LLM answer was not JSON", None)
    assert len(queue.dead_list()) == len(users)
    return queue


def dead_users(queue: QueueClient) -> set[str]:
    from memq.core.identity import ContextKey

    return {ContextKey.from_id(e.context_id).user_id for e in queue.dead_list()}


def test_chosen_dead_letters_are_retried_and_purged_together(
    make_settings: Any, serve_for: Any, redis_client: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings(max_attempts=1)
    users = ["app1-ann@example.com", "app1-bo|x/y", "app1-cy%2F.z", "app1-dee"]
    queue = dead_letters(settings, redis_client, users)
    server = serve_for(settings)
    log_in(browser, server.url, Keys().admin)
    browser.get(server.url + "/ui/queue")
    failures = fits_and_passes_axe(browser, "queue")

    def row_of(user: str) -> Any:
        (row,) = [
            r
            for r in browser.find_elements(By.CSS_SELECTOR, "#dead tbody tr[data-context]")
            if r.find_element(By.CLASS_NAME, "user-cell").text == user
        ]
        return row

    # Nothing ticked: one clear line, and nothing retried.
    at_width(browser, DESKTOP)
    navigate(browser, by_id(browser, "retry-selected").click)
    assert "no dead letter chosen" in by_id(browser, "error-message").text
    assert len(queue.dead_list()) == 4
    assert all("422" in line for line in console_errors(browser))  # the refusal, nothing else

    # Two ticked and retried: due again, the other two still dead.
    browser.get(server.url + "/ui/queue")
    for user in users[:2]:
        row_of(user).find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    navigate(browser, by_id(browser, "retry-selected").click)
    assert "2 dead letters retried" in by_id(browser, "notice").text
    assert dead_users(queue) == set(users[2:])
    assert queue.stats()["due"] == 2

    # One ticked and purged (after the confirmation): gone for good; one row's own button then
    # retries only its row even with another row ticked.
    row_of(users[2]).find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    navigate(browser, by_id(browser, "purge-selected").click, alert=True)
    assert "1 dead letter purged" in by_id(browser, "notice").text
    assert dead_users(queue) == {users[3]}
    assert queue.stats()["due"] == 2
    assert [
        r.get_attribute("data-context")
        for r in browser.find_elements(By.CSS_SELECTOR, "#dead tbody tr[data-context]")
    ] == [queue.dead_list()[0].context_id]
    failures += fits_and_passes_axe(browser, "queue after a purge")
    assert console_errors(browser) == []
    assert not failures, "\n".join(failures)


def api_search(server: Any, user: str, agent: str | None, text: str) -> list[str]:
    """The fact ids the HTTP API's relevance search answers for one memory, best first."""
    body: dict[str, Any] = {"query": text, "limit": 20, "agent_name": agent}
    answer = httpx.post(
        f"{server.url}/v1/users/{path_segment(user)}/facts/search",
        json=body,
        headers=bearer(Keys().admin),
        timeout=30,
    )
    answer.raise_for_status()
    return [f["id"] for f in answer.json()["facts"]]


def test_every_memory_of_a_user_side_by_side_searched_as_the_api_searches(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings()
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    memories: dict[str | None, list[str]] = {
        None: [
            "用户在杭州的一家电商公司担任数据工程师",
            "Lives in Berlin since March",
            "Drinks tea",
        ],
        "planner.v2": ["Moved to Berlin for a job at Zalando", "Prefers Rust for services"],
        "coder/x%2f": ["Works on 杭州 projects remotely", "Uses vim"],
    }
    for agent, texts in memories.items():
        for n, text in enumerate(texts):
            manager.add_fact(USER, text, agent_name=agent, confidence=0.5 + n / 10)
    server = serve_for(settings)
    log_in(browser, server.url, Keys().admin)
    browser.get(f"{server.url}/ui/users/{path_segment(USER)}")
    failures = fits_and_passes_axe(browser, "user")

    def shown() -> dict[str | None, list[str]]:
        found: dict[str | None, list[str]] = {}
        for column in browser.find_elements(By.CSS_SELECTOR, "#memories section[data-agent]"):
            agent = column.get_attribute("data-agent") or None
            found[agent] = [
                str(li.get_attribute("data-fact-id"))
                for li in column.find_elements(By.CSS_SELECTOR, "li[data-fact-id]")
            ]
        return found

    # Without a search: every memory, the user-global one first, each fact once, best first.
    at_width(browser, DESKTOP)
    navigate(browser, by_id(browser, "all-memories").click)
    listed = shown()
    assert list(listed) == [None, "coder/x%2f", "planner.v2"]
    for agent, ids in listed.items():
        facts = sorted(manager.list_facts(USER, agent_name=agent), key=lambda f: -f.confidence)
        assert ids == [f.id for f in facts]
    failures += fits_and_passes_axe(browser, "every memory")

    # Searches the substring filter missed: each column is the API's answer for its memory.
    for text in ("杭州 工作", "Berlin lives"):
        browser.get(f"{server.url}/ui/users/{path_segment(USER)}")
        by_id(browser, "user-text").send_keys(text)
        navigate(browser, by_id(browser, "user-search-button").click)
        found = shown()
        assert found == {a: api_search(server, USER, a, text) for a in memories}, text
        assert any(found.values()), text
        assert by_id(browser, "all-text").get_attribute("value") == text
    chinese = manager.list_facts(USER)[0]
    assert found_in(shown(), chinese.id) is False  # "Berlin lives" is not about Hangzhou
    failures += fits_and_passes_axe(browser, "every memory searched")
    assert console_errors(browser) == []
    assert not failures, "\n".join(failures)


def found_in(columns: dict[str | None, list[str]], fact_id: str) -> bool:
    return any(fact_id in ids for ids in columns.values())


def downloaded(folder: Path, name: str) -> Any:
    """The JSON of a file the browser finished downloading into ``folder``."""
    wait_for(lambda: (folder / name).exists(), what=f"{name} downloaded")
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_a_memory_exported_in_both_formats_and_imported_within_its_caps(
    make_settings: Any, serve_for: Any, browser: WebDriver, tmp_path: Path
) -> None:
    settings: MemqSettings = make_settings(max_facts=10, serve_max_body_bytes=20_000)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    for text in ("Lives in Berlin", "用户喜欢喝茶", "Prefers Rust"):
        manager.add_fact(USER, text, agent_name=AGENT, confidence=0.8)
    server = serve_for(settings)
    api = httpx.Client(base_url=server.url, headers=bearer(Keys().admin), timeout=30)
    folder = tmp_path / "downloads"
    folder.mkdir()
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)}
    )
    log_in(browser, server.url, Keys().admin)
    memory = f"{server.url}/ui/users/{path_segment(USER)}/memory?agent={path_segment(AGENT)}"
    browser.get(memory)
    navigate(browser, by_id(browser, "tab-transfer").click)
    failures = fits_and_passes_axe(browser, "export and import")
    at_width(browser, DESKTOP)

    # Both downloads are what the API's export answers.
    for format in ("memq", "deerflow"):
        by_id(browser, f"export-{format}").click()
        got = downloaded(folder, f"app1-zo_team_2Fa.b.planner.v2.{format}.json")
        params = {"agent_name": AGENT, "format": format}
        assert got == api.get(f"/v1/users/{path_segment(USER)}/export", params=params).json()
    assert "10 facts" in by_id(browser, "import-caps").text

    def import_file(name: str, content: str) -> None:
        path = tmp_path / name
        path.write_text(content, encoding="utf-8")
        browser.get(memory + "&tab=transfer")
        by_id(browser, "import-file").send_keys(str(path))
        navigate(browser, by_id(browser, "import-button").click, alert=True)

    before = manager.export(USER, agent_name=AGENT)
    # Over the cap: one clear line on a page inside the layout, and nothing written.
    eleven = {"facts": [{"content": f"fact {n}", "confidence": 0.5} for n in range(11)]}
    import_file("big.json", json.dumps(eleven))
    assert by_id(browser, "error-message").text == (
        "the file holds 11 facts, over the cap of 10 per memory (MEMQ_MAX_FACTS): nothing imported"
    )
    assert browser.find_elements(By.ID, "logout")  # the page keeps the navigation
    failures += fits_and_passes_axe(browser, "refused import")
    # Over the server's body cap: refused before it is read, as a page too.
    import_file("huge.json", json.dumps({"facts": [{"content": "x" * 900}] * 30}))
    assert by_id(browser, "error-message").text == (
        "request body above 20000 bytes (MEMQ_SERVE_MAX_BODY_BYTES)"
    )
    assert browser.find_elements(By.ID, "logout")
    import_file("broken.json", '{"facts": [')
    assert by_id(browser, "error-message").text.startswith("not JSON")
    assert manager.export(USER, agent_name=AGENT) == before
    console_errors(browser)  # the refusals' status lines, read and dropped

    # A DeerFlow memory.json replaces the memory; the import is in the history.
    deerflow = {
        "version": "1.0",
        "user": {"workContext": {"summary": "Data engineer at Zalando"}},
        "facts": [
            {"id": "fact_a", "content": "Moved to Berlin in March", "category": "context"},
            {"id": "fact_b", "content": "用户在杭州工作过", "category": "knowledge"},
        ],
    }
    import_file("memory.json", json.dumps(deerflow, ensure_ascii=False))
    assert "imported file" in by_id(browser, "notice").text
    facts = manager.list_facts(USER, agent_name=AGENT)
    assert sorted(f.content for f in facts) == ["Moved to Berlin in March", "用户在杭州工作过"]
    assert manager.history(USER, agent_name=AGENT, limit=1)[0].action == "import"
    assert manager.list_facts(USER) == []  # the user-global memory was not touched
    api.close()
    assert console_errors(browser) == []
    assert not failures, "\n".join(failures)


def test_errors_under_ui_are_pages_inside_the_layout_and_v1_keeps_problem_json(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    settings: MemqSettings = make_settings()
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    manager.add_fact("app2-other", "Lives in Berlin")
    server = serve_for(settings)
    ui = server.url + "/ui"
    log_in(browser, server.url, Keys().app1_admin)
    failures: list[str] = []
    pages = {
        "unknown page": (f"{ui}/no/such/page", 404, "there is no such page in the inspector"),
        "unknown fact": (
            f"{ui}/users/{path_segment(USER)}/facts/no-such-fact",
            404,
            "no fact 'no-such-fact' in this memory",
        ),
        "another prefix's user": (f"{ui}/users/app2-other", 403, "app1-"),
        "the queue, for a key bound to a prefix": (f"{ui}/queue", 403, "every user"),
        "a form's address": (f"{ui}/queue/dead/retry", 405, "form"),
    }
    for name, (url, status, says) in pages.items():
        browser.get(url)
        heading = browser.find_element(By.TAG_NAME, "h1").text
        assert heading.startswith(str(status)), (name, heading)
        assert says in by_id(browser, "error-message").text, name
        # Inside the layout: the navigation, who is logged in, the logout button.
        assert browser.find_element(By.CSS_SELECTOR, "header nav a").text == "Users", name
        assert by_id(browser, "logout").is_displayed(), name
        failures += fits_and_passes_axe(browser, name)
    browser.delete_all_cookies()
    browser.get(f"{ui}/no/such/page")  # no session: the page still, without the navigation
    assert by_id(browser, "error-message").text == "there is no such page in the inspector"
    assert browser.find_elements(By.ID, "logout") == []
    console_errors(browser)  # the pages' own status lines, read and dropped

    for path in ("/v1/no/such/route", "/v1/users/app2-other/memory"):
        answer = httpx.get(server.url + path, headers=bearer(Keys().app1_admin), timeout=30)
        assert answer.status_code in (403, 404), path
        assert answer.headers["content-type"].startswith("application/problem+json"), path
    assert not failures, "\n".join(failures)


def test_the_preview_ranks_what_it_left_out_with_score_tokens_and_reason_linked_to_the_fact(
    make_settings: Any, serve_for: Any, browser: WebDriver
) -> None:
    # Corrections have 20 tokens of their own: the long one does not fit them.
    settings: MemqSettings = make_settings(guaranteed_token_budget=20)
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    for n in range(30):
        topic = "Berlin" if n % 3 == 0 else ("杭州" if n % 3 == 1 else "tea")
        manager.add_fact(
            USER, f"Fact {n} about {topic} and more", agent_name=AGENT, confidence=0.3 + n / 50
        )
    manager.add_fact(
        USER, "Not Munich: Berlin " + "x " * 40, agent_name=AGENT, category="correction"
    )
    server = serve_for(settings)
    log_in(browser, server.url, Keys().admin)
    browser.get(f"{server.url}/ui/users/{path_segment(USER)}/preview?agent={path_segment(AGENT)}")
    by_id(browser, "query").send_keys("Berlin")
    budget = by_id(browser, "budget")
    budget.clear()
    budget.send_keys("120")
    navigate(browser, by_id(browser, "preview-button").click)
    failures = fits_and_passes_axe(browser, "preview")
    at_width(browser, DESKTOP)

    # What the page lists is the injector's own decision, row for row.
    service = MemqService(settings)
    plan = service.recall_plan(OPEN_ACCESS, USER, AGENT, query="Berlin", max_tokens=120)
    service.close()
    rows = browser.find_elements(By.CSS_SELECTOR, "#left-out tbody tr[data-fact-id]")
    shown = [
        (
            r.get_attribute("data-fact-id"),
            int(r.find_element(By.CSS_SELECTOR, "td.num").text),
            r.find_element(By.CLASS_NAME, "score").text,
            int(r.find_element(By.CLASS_NAME, "tokens").text),
            r.get_attribute("data-reason"),
        )
        for r in rows
    ]
    assert shown == [
        (i.fact.id, i.rank, f"{i.score:.3f}", i.tokens, i.reason) for i in plan.left_out
    ]
    ranks = [rank for _, rank, _, _, _ in shown]
    assert ranks == sorted(ranks) and len(ranks) > 10
    assert {reason for *_, reason in shown} == {"budget", "category"}
    scores = [float(score) for _, _, score, _, _ in shown]
    regular = [s for s, row in zip(scores, shown, strict=True) if row[4] == "budget"]
    assert regular == sorted(regular, reverse=True)  # best ranked first
    assert "relevance" in by_id(browser, "score-note").text
    # Each row links to its fact's page.
    first = rows[0]
    fact_id = first.get_attribute("data-fact-id")
    navigate(browser, first.find_element(By.TAG_NAME, "a").click)
    assert f"/facts/{fact_id}" in browser.current_url
    assert console_errors(browser) == []
    assert not failures, "\n".join(failures)
