"""``python -m tests.support.screenshots [DIR]`` (``make screenshots``): the inspector's main pages
as PNGs (docs/screenshots/ by default), taken in headless Chromium from a real stack.

A private Redis, a Celery worker and beat extracting from the scripted OpenAI-compatible server,
and `memq serve`; a sample user whose memory was learnt from three threads, imported summaries,
a fact corrected by hand, and one thread that died on an unparsable answer.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.celery_procs import CeleryProcs, memq_env
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.replies import Reply
from memq.testing.serve_proc import ServeProcess
from memq.testing.waiting import wait_for
from producer import MemoryProducer
from storage import get_storage
from storage.management import MemoryManager
from tests.support.inspector import chromium_paths
from tests.support.scenarios import conversation_of
from tests.support.serve import Keys, write_keys
from tests.support.started_queue import StartingQueue

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
USER = "acme-alice"
# What the scripted model learns from each thread (keyed by a word its conversation carries).
LEARNT = {
    "Berlin": ("Works on the payments team in Berlin", "knowledge", 0.95),
    "Rust": ("Prefers Rust for services and Python for scripts", "preference", 0.9),
    "marathon": ("Training for the Berlin marathon in September", "goal", 0.85),
}
THREADS = {
    "onboarding-7f3a": "I moved to Berlin last year and joined the payments team.",
    "code-review-19c2": "For services I reach for Rust; Python is for scripts.",
    "weekend-plans-d04e": "I am training for the marathon, long runs on Sundays.",
}
POISON_THREAD = "import-run-552b"


def responder(request: dict[str, Any]) -> Reply:
    text = conversation_of(request)
    if "spreadsheet" in text:
        return Reply(content="I think the user likes spreadsheets, probably.")
    facts = [
        # m1: the user's message, the first of the run (its source keeps an excerpt of it).
        {"content": content, "category": category, "confidence": confidence, "cites": ["m1"]}
        for word, (content, category, confidence) in LEARNT.items()
        if word in text
    ]
    answer = {"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []}
    return Reply(content=json.dumps(answer))


def turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]


def seed(settings: MemqSettings, redis_client: Any) -> None:
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    manager.import_document(
        USER,
        {
            "user": {
                "workContext": {"summary": "Backend engineer at Acme, payments team, Berlin."},
                "topOfMind": {"summary": "Migrating the settlement service to Rust."},
            },
            "history": {"recentMonths": {"summary": "Moved to Berlin; started marathon training."}},
            "facts": [
                {
                    "content": "Reviews pull requests in the morning",
                    "category": "behavior",
                    "confidence": 0.6,
                }
            ],
        },
    )
    with MemoryProducer(settings) as producer:
        for thread, text in THREADS.items():
            producer.enqueue(thread, USER, None, turn(text), flush=True)
        producer.enqueue(POISON_THREAD, USER, None, turn("Import my spreadsheet."), flush=True)
    queue = StartingQueue(settings, redis_client)
    wait_for(
        # Every fact the threads teach (not a count: the imported fact is there too).
        lambda: (
            {content for content, _, _ in LEARNT.values()}
            <= {f.content for f in manager.list_facts(USER)}
            and queue.dead_list()
        ),
        what="the sample memory learnt and one dead letter",
    )
    manager.add_fact(USER, "Does not eat meat", category="preference", confidence=0.8)
    manager.add_fact(
        USER,
        "Calls the settlement service <settle/> — not \u201cledger\u201d",
        category="correction",
    )
    goal = next(f for f in manager.list_facts(USER) if f.category == "goal")
    manager.edit_fact(USER, goal.id, confidence=0.7)
    for n in range(1, 4):
        manager.add_fact(f"acme-user-{n:03d}", "Uses memq", confidence=0.5)
    # An agent's own memory beside the user-global one (the all-memories view).
    for text in ("Books the team's Berlin office for Thursdays", "Prefers short stand-ups"):
        manager.add_fact(USER, text, agent_name="planner", category="preference", confidence=0.7)


def shoot(url: str, out: Path) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    paths = chromium_paths()
    if paths is None:
        raise SystemExit("screenshots need chromium and chromedriver (apt-get install ...)")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=paths[1]))
    taken: list[Path] = []

    def save(name: str, width: int = 1280) -> None:
        # The whole page, not the first screenful (Chromium's own full-page capture).
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 2400), "scale": 1},
            },
        )
        path = out / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        taken.append(path)

    try:
        driver.get(url + "/ui/login")
        save("login")
        driver.find_element(By.ID, "key").send_keys(Keys().admin)
        driver.find_element(By.ID, "login").click()
        driver.get(url + "/ui/users?prefix=acme-")
        save("users")
        driver.get(f"{url}/ui/users/{USER}/memory")
        save("memory")
        driver.find_element(By.PARTIAL_LINK_TEXT, "marathon").click()
        save("fact")
        driver.get(f"{url}/ui/users/{USER}/preview")
        driver.find_element(By.ID, "query").send_keys("What should I cook for the team dinner?")
        budget = driver.find_element(By.ID, "budget")
        budget.clear()
        budget.send_keys("110")
        driver.find_element(By.ID, "preview-button").click()
        save("preview")
        driver.get(f"{url}/ui/users/{USER}/all?text=Berlin")
        save("every-memory")
        driver.get(f"{url}/ui/users/{USER}/memory?tab=transfer")
        save("export-import")
        driver.get(url + "/ui/queue")
        wait_for(
            lambda: driver.find_element(By.ID, "live").text.startswith("(live"),
            what="the live figures",
        )
        save("queue")
        # A phone (390 px: each row a card), then the Chinese pages (the header's switch).
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get(f"{url}/ui/users/{USER}/memory")
        save("memory-phone", width=390)
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.get(f"{url}/ui/lang/zh-Hans?next=/users/{USER}")
        save("user-zh")
        driver.get(f"{url}/ui/users/{USER}/memory")
        save("memory-zh")
    finally:
        driver.quit()
    return taken


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memq-shots-") as scratch:
        tmp = Path(scratch)
        redis_server = RedisServer(tmp / "redis", appendonly=False).start()
        model = ScriptedOpenAI(responder).start()
        procs = CeleryProcs(tmp / "logs")
        try:
            settings = MemqSettings(
                redis_url=redis_server.url,
                key_prefix="shots",
                storage_dir=tmp / "memory",
                data_dir=tmp / "data",
                llm_provider="openai",
                llm_base_url=model.base_url,
                llm_api_key="sk-scripted",
                llm_max_retries=0,
                max_attempts=1,
                tick_seconds=0.2,
                debounce_seconds=0.0,
                token_counting=False,
            )
            keys_file = write_keys(tmp / "keys.json")
            env = memq_env(settings)
            procs.start_worker(env)
            procs.start_beat(env)
            import redis

            client = redis.Redis.from_url(redis_server.url, decode_responses=True)
            seed(settings, client)
            client.close()
            serve_env = memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file))
            with ServeProcess(serve_env, tmp / "serve.log") as server:
                for path in shoot(server.url, out):
                    print(f"wrote {path}")
        finally:
            procs.stop()
            model.stop()
            redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
