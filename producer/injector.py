"""The agent-side reader: the ``<user_memory>`` block for the next prompt.

Every call reads the latest memory (DeerFlow froze it per thread, so what a thread taught
was only seen by the next one); the file backend's stat-checked cache keeps that cheap. Injection is
best effort: any failure is logged and the agent simply gets no memory for that turn.
"""

from __future__ import annotations

import logging
import threading

from memq.core.identity import DEFAULT_USER_ID
from memq.core.settings import MemqSettings, load_settings
from prompts.injection import format_memory_for_injection
from prompts.tokens import TokenCounter, make_token_counter
from storage.base import MemoryStorage
from storage.location import check_reader_soon

log = logging.getLogger(__name__)

OPEN_TAG = "<user_memory>"
CLOSE_TAG = "</user_memory>"


class MemoryInjector:
    """``MemoryInjector().block(user_id, agent_name)`` → the block to put before the user's turn."""

    def __init__(
        self, settings: MemqSettings | None = None, storage: MemoryStorage | None = None
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._counter: TokenCounter | None = None
        self._setup_lock = threading.Lock()

    def _ready(self) -> tuple[MemqSettings, MemoryStorage, TokenCounter]:
        # Built on first use, inside `block`'s safety net: a bad config or an unreachable backend
        # must not break the agent that merely constructed an injector.
        with self._setup_lock:
            if self._settings is None:
                self._settings = load_settings()
            if self._storage is None:
                from storage import get_storage

                self._storage = get_storage(self._settings)
                check_reader_soon(self._settings, "injector")  # logs if workers store elsewhere
            if self._counter is None:
                self._counter = make_token_counter(self._settings.token_counting)
            return self._settings, self._storage, self._counter

    def text(
        self, user_id: str | None, agent_name: str | None = None, *, query: str | None = None
    ) -> str:
        """The memory text without the wrapper; raises on failure (for tools and the CLI).

        ``query`` (typically the user's latest message) fills the budget by relevance blended
        with confidence; without it facts come by confidence alone."""
        settings, storage, counter = self._ready()
        if not (settings.enabled and settings.injection_enabled):
            return ""
        return format_memory_for_injection(
            storage.load(DEFAULT_USER_ID if user_id is None else user_id, agent_name),
            settings.injected_memory_max_tokens,
            guaranteed_categories=settings.guaranteed_categories,
            guaranteed_token_budget=settings.guaranteed_token_budget,
            count_tokens=counter,
            query=query,
        )

    def block(
        self, user_id: str | None, agent_name: str | None = None, *, query: str | None = None
    ) -> str:
        """``"<user_memory>\\n…\\n</user_memory>"``, or ``""`` when there is nothing to inject,
        injection is disabled, or anything went wrong (logged; never raised into the agent).
        ``query``: see :meth:`text`."""
        try:
            content = self.text(user_id, agent_name, query=query)
        except Exception:
            log.exception("memory injection failed for user=%s agent=%s", user_id, agent_name)
            return ""
        if not content.strip():
            return ""
        return f"{OPEN_TAG}\n{content}\n{CLOSE_TAG}"
