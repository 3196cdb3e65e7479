"""Memory documents the storage and management tests share: DeerFlow's own ``memory.json`` and
small builders."""

from __future__ import annotations

from storage.document import Fact, MemoryDocument

# DeerFlow's memory.json, verbatim from deerflow-memory.md §5.1.
DEERFLOW_MEMORY_JSON = """{
  "version": "1.0",
  "lastUpdated": "2026-07-15T02:03:33.123456Z",
  "user": {
    "workContext":     { "summary": "Backend engineer at Acme; maintains the billing service (Go, Postgres).", "updatedAt": "2026-07-14T09:00:00.000000Z" },
    "personalContext": { "summary": "Bilingual (English/Chinese); prefers short answers.", "updatedAt": "2026-07-10T08:00:00.000000Z" },
    "topOfMind":       { "summary": "", "updatedAt": "" }
  },
  "history": {
    "recentMonths":       { "summary": "", "updatedAt": "" },
    "earlierContext":     { "summary": "", "updatedAt": "" },
    "longTermBackground": { "summary": "", "updatedAt": "" }
  },
  "facts": [
    { "id": "fact_3f9a1c2e", "content": "Uses uv instead of pip for Python projects", "category": "preference",
      "confidence": 0.9, "createdAt": "2026-07-14T09:00:00.000000Z", "source": "thread-42" },
    { "id": "fact_77b0d4aa", "content": "Run the app with make dev", "category": "correction",
      "confidence": 0.95, "createdAt": "2026-07-14T09:00:00.000000Z", "source": "thread-42",
      "sourceError": "The agent suggested npm start" },
    { "id": "fact_0c1d2e3f", "content": "Full-stack: React, Python, PostgreSQL", "category": "knowledge",
      "confidence": 0.85, "createdAt": "2026-05-01T00:00:00Z", "consolidatedAt": "2026-07-15T02:03:33.123456Z",
      "source": "consolidation", "consolidatedFrom": ["fact_a1", "fact_b2"] }
  ]
}
"""  # noqa: E501 (verbatim from the reference)


def doc_with(*contents: str) -> MemoryDocument:
    return MemoryDocument(facts=[Fact(content=c, confidence=0.8) for c in contents])


def contents(document: MemoryDocument) -> list[str]:
    return [f.content for f in document.facts]
