"""List answers page, on a real `memq serve`: a bounded default, `limit`, and a `next_cursor` that
walks every item once; a cursor the server never gave is one clear line. The page rule itself is
pure (memq/operations/paging.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from memq.core.errors import InvalidIdentifier
from memq.core.settings import MemqSettings
from memq.operations.paging import DEFAULT_LIMIT, page
from storage import get_storage
from storage.management import MemoryManager
from tests.support.serve import Keys, bearer


def test_pages_walk_every_item_once() -> None:
    items = list(range(25))
    seen, cursor = [], None
    while True:
        chunk = page(items, 10, cursor)
        seen += chunk.items
        cursor = chunk.next_cursor
        if cursor is None:
            break
    assert seen == items
    assert page(items, 25, None).next_cursor is None
    with pytest.raises(InvalidIdentifier, match="cursor"):
        page(items, 10, "-3")


@pytest.mark.integration
def test_list_endpoints_page_with_a_bounded_default(settings: MemqSettings, serve_for: Any) -> None:
    manager = MemoryManager(get_storage(settings))  # uncapped: more facts than one page
    for n in range(DEFAULT_LIMIT + 20):
        manager.add_fact("pat", f"Pat owns item {n}")
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, headers=bearer(Keys().admin), timeout=30) as http:
        first = http.get("/v1/users/pat/facts").json()
        assert len(first["facts"]) == DEFAULT_LIMIT and first["next_cursor"]
        contents, cursor = [], None
        while True:
            params = {"limit": 50, **({"cursor": cursor} if cursor else {})}
            answer = http.get("/v1/users/pat/facts", params=params).json()
            contents += [f["content"] for f in answer["facts"]]
            cursor = answer["next_cursor"]
            if cursor is None:
                break
        assert sorted(contents) == sorted(f"Pat owns item {n}" for n in range(DEFAULT_LIMIT + 20))
        history = http.get("/v1/users/pat/history", params={"limit": 7}).json()
        assert len(history["changes"]) == 7 and history["next_cursor"] == "7"
        nxt = http.get("/v1/users/pat/history", params={"limit": 7, "cursor": "7"}).json()
        assert len(nxt["changes"]) == 7
        assert nxt["changes"][0] != history["changes"][0]
        bad = http.get("/v1/users/pat/facts", params={"cursor": "abc"})
        assert bad.status_code == 422 and "cursor" in bad.json()["detail"]
        too_many = http.get("/v1/users/pat/facts", params={"limit": 100_000})
        assert too_many.status_code == 422
        dead = http.get("/v1/dead-letters", params={"limit": 5}).json()
        assert dead == {"dead_letters": [], "next_cursor": None}
