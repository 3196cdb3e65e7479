"""Migrate a whole DeerFlow memory folder into memq: every user, every agent, both layouts.

- The older layout: one ``memory.json`` per scope — ``DIR/memory.json`` and
  ``DIR/agents/{agent}/memory.json`` (no user: DeerFlow's ``default``), and
  ``DIR/users/{user}/memory.json``, ``DIR/users/{user}/agents/{agent}/memory.json``.
- The current layout (DeerFlow storage v2): ``DIR/users/{user}/memory.json`` holds the user-level
  summaries only, and every fact is a Markdown file with YAML front matter under
  ``DIR/users/{user}/agents/{agent}/facts/{2 hex}/{id}.md``. DeerFlow's ``__default__`` agent
  bucket (and a ``lead-agent`` folder without a ``config.yaml``, its previous default) is memq's
  user-global memory.

Everything is read and checked before anything is written, so a bad file stops the import with
one line naming it and nothing half-imported. Writing merges: a fact whose id is already there is
left alone, a summary only fills an empty section — so a second run adds nothing, and facts memq
learned since the first run stay.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memq.core.errors import InvalidIdentifier, InvalidMemoryData
from memq.core.identity import (
    ANONYMOUS_USER_ID,
    validate_agent_name,
    validate_user_id,
)
from storage.base import Change, MemoryStorage, UpdateResult
from storage.cap import DEFAULT_FACT_MAX_CHARS, cap_fact_length
from storage.document import MemoryDocument
from storage.fact_input import parse_import
from storage.sections import HISTORY_SECTIONS, USER_SECTIONS

log = logging.getLogger(__name__)

DEFAULT_AGENT_BUCKET = "__default__"
DEERFLOW_DEFAULT_USER = "default"
PREVIOUS_DEFAULT_AGENT = "lead-agent"


def from_deerflow_user(user_id: str | None) -> str | None:
    """DeerFlow's user id as memq's. DeerFlow calls its user without login ``"default"`` (its
    folder ``users/default``, the id its call sites fall back to) and some calls pass None: both
    are memq's anonymous user, so the importer and the DeerFlow backend find the same memory. Any
    other value is left for the caller to validate."""
    if user_id is None or user_id == DEERFLOW_DEFAULT_USER:
        return ANONYMOUS_USER_ID
    return user_id


class DeerFlowImportError(InvalidMemoryData):
    """A file of the DeerFlow folder memq cannot read; names the file."""


@dataclass
class ScopeImport:
    """What was found for one (user, agent): summaries and facts, and the files they came from."""

    user_id: str
    agent_name: str | None
    document: MemoryDocument = field(default_factory=MemoryDocument)
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class ImportReport:
    users: int
    documents: int
    facts_added: int
    facts_present: int
    summaries_set: int
    files: int
    facts_cut: int = 0  # added facts cut to fact_max_chars

    def describe(self) -> str:
        cut = f", {self.facts_cut} over-long fact(s) cut" if self.facts_cut else ""
        return (
            f"{self.users} user(s), {self.documents} memory document(s) from {self.files} "
            f"file(s): {self.facts_added} fact(s) added{cut}, {self.facts_present} already "
            f"present, {self.summaries_set} summary section(s) set"
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DeerFlowImportError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise DeerFlowImportError(f"{path}: a memory document must be a JSON object")
    return data


def fact_from_markdown(path: Path) -> dict[str, Any]:
    """One DeerFlow v2 fact file → a fact in DeerFlow's public shape (``source`` a string,
    ``category`` DeerFlow's original when it stored ``other`` + ``categoryExtension``)."""
    try:
        text = path.read_text(encoding="utf-8")
        if not text.startswith("---\n") or "\n---\n" not in text[4:]:
            raise ValueError("no YAML front matter")
        front, body = text[4:].split("\n---\n", 1)
        meta = yaml.safe_load(front) or {}
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise DeerFlowImportError(f"{path}: not a DeerFlow fact file ({exc})") from exc
    if not isinstance(meta, dict):
        raise DeerFlowImportError(f"{path}: the front matter is not a mapping")
    lines = body.lstrip("\n").splitlines()
    if lines and lines[0].startswith("# "):  # the title DeerFlow renders from the content
        lines = lines[1:]
    content = "\n".join(lines).strip()
    if not content:
        raise DeerFlowImportError(f"{path}: the fact has no content")
    source = meta.get("source")
    if isinstance(source, dict):
        kind, thread = source.get("type"), source.get("threadId")
        source = thread if kind == "conversation" and thread else (kind or "unknown")
    category = meta.get("category")
    if category == "other" and isinstance(meta.get("categoryExtension"), str):
        category = meta["categoryExtension"]
    fact = {
        "id": str(meta.get("id") or path.stem),
        "content": content,
        "category": category,
        "confidence": meta.get("confidence"),
        "createdAt": meta.get("createdAt"),
        "source": source,
        "sourceError": meta.get("sourceError"),
        "consolidatedFrom": meta.get("consolidatedFrom"),
        "consolidatedAt": meta.get("consolidatedAt"),
    }
    return {k: v for k, v in fact.items() if v is not None}


def _agent(name: str, agent_dir: Path) -> str | None:
    if name == DEFAULT_AGENT_BUCKET:
        return None
    if name == PREVIOUS_DEFAULT_AGENT and not (agent_dir / "config.yaml").is_file():
        return None
    return validate_agent_name(name)


def _document(path: Path) -> MemoryDocument:
    data = _read_json(path)
    if isinstance(data.get("facts"), dict):
        # An early v2 manifest (fact id → Markdown path): the facts are read from the files.
        data = {k: v for k, v in data.items() if k != "facts"}
    try:
        return parse_import(data)
    except InvalidMemoryData as exc:
        if isinstance(exc, DeerFlowImportError):
            raise
        raise DeerFlowImportError(f"{path}: {exc}") from exc


def _scopes_of_user(user_dir: Path, user_id: str) -> Iterator[ScopeImport]:
    memory = user_dir / "memory.json"
    if memory.is_file():
        yield ScopeImport(user_id, None, _document(memory), [memory])
    agents = user_dir / "agents"
    for agent_dir in sorted(agents.iterdir()) if agents.is_dir() else []:
        legacy = agent_dir / "memory.json"
        fact_files = sorted((agent_dir / "facts").glob("**/*.md"))
        if not legacy.is_file() and not fact_files:
            continue  # an agent's definition (config.yaml, SOUL.md) without memory
        try:
            agent = _agent(agent_dir.name, agent_dir)
        except InvalidIdentifier as exc:
            raise DeerFlowImportError(f"{agent_dir}: {exc}") from exc
        if legacy.is_file():
            yield ScopeImport(user_id, agent, _document(legacy), [legacy])
        if fact_files:
            facts = [fact_from_markdown(p) for p in fact_files]
            try:
                document = MemoryDocument.model_validate({"facts": facts})
            except ValueError as exc:
                raise DeerFlowImportError(f"{agent_dir / 'facts'}: {exc}") from exc
            yield ScopeImport(user_id, agent, document, fact_files)


def read_folder(root: Path) -> list[ScopeImport]:
    """Every (user, agent) memory of a DeerFlow folder, merged per scope; raises
    :class:`DeerFlowImportError` naming the first file it cannot use."""
    root = Path(root)
    if not root.is_dir():
        raise DeerFlowImportError(f"{root}: not a folder")
    found: list[ScopeImport] = []
    found.extend(_scopes_of_user(root, ANONYMOUS_USER_ID))  # DIR/memory.json, DIR/agents/*
    users = root / "users"
    for user_dir in sorted(users.iterdir()) if users.is_dir() else []:
        if not user_dir.is_dir():
            continue
        try:
            # DeerFlow's "default" is memq's anonymous user, which also gets the legacy
            # DIR/memory.json above.
            user = validate_user_id(from_deerflow_user(user_dir.name))
        except InvalidIdentifier as exc:
            raise DeerFlowImportError(f"{user_dir}: {exc}") from exc
        found.extend(_scopes_of_user(user_dir, user))
    merged: dict[tuple[str, str | None], ScopeImport] = {}
    for scope in found:
        key = (scope.user_id, scope.agent_name)
        if key not in merged:
            merged[key] = scope
            continue
        into = merged[key]
        into.files += scope.files
        into.document = merge(into.document, scope.document)[0]
    if not merged:
        raise DeerFlowImportError(
            f"{root}: no DeerFlow memory found (no memory.json, users/*/memory.json or "
            "users/*/agents/*/facts/**/*.md)"
        )
    return list(merged.values())


def merge(current: MemoryDocument, imported: MemoryDocument) -> tuple[MemoryDocument, int, int]:
    """``current`` with the imported facts whose ids it lacks and the imported summaries of its
    empty sections. Returns (document, facts added, summary sections set)."""
    document = current.model_copy(deep=True)
    known = {f.id for f in document.facts}
    added = [f.model_copy() for f in imported.facts if f.id not in known]
    document.facts.extend(added)
    summaries = 0
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        for name in names:
            mine = getattr(getattr(document, group), name)
            theirs = getattr(getattr(imported, group), name)
            if not mine.summary.strip() and theirs.summary.strip():
                setattr(getattr(document, group), name, theirs.model_copy())
                summaries += 1
    return document, len(added), summaries


def import_folder(
    storage: MemoryStorage, root: Path, *, fact_max_chars: int = DEFAULT_FACT_MAX_CHARS
) -> ImportReport:
    """Import (merge) a DeerFlow memory folder into ``storage``; safe to run again. Facts longer
    than ``fact_max_chars`` (pass ``settings.fact_max_chars``) are cut, and counted."""
    scopes = read_folder(root)
    added_total = present_total = summaries_total = cut_total = 0
    for scope in scopes:
        counts: list[int] = [0, 0, 0]
        capped = [cap_fact_length(f, fact_max_chars) for f in scope.document.facts]
        scope.document.facts = [fact for fact, _ in capped]
        cut_ids = {fact.id for fact, over in capped if over}

        def apply(
            document: MemoryDocument,
            scope: ScopeImport = scope,
            counts: list[int] = counts,
            cut_ids: set[str] = cut_ids,
        ) -> UpdateResult:
            merged, added, summaries = merge(document, scope.document)
            new_ids = {f.id for f in merged.facts} - {f.id for f in document.facts}
            counts[:] = [added, summaries, len(new_ids & cut_ids)]
            changes = [
                Change(action="import", fact_id=f.id, content=f.content, reason="from DeerFlow")
                for f in merged.facts
                if f.id in new_ids
            ]
            return UpdateResult(merged, changes)

        storage.update(scope.user_id, scope.agent_name, apply)
        added_total += counts[0]
        present_total += len(scope.document.facts) - counts[0]
        summaries_total += counts[1]
        cut_total += counts[2]
    if cut_total:
        log.info(
            "DeerFlow import: %d over-long fact(s) cut to %d characters", cut_total, fact_max_chars
        )
    return ImportReport(
        users=len({s.user_id for s in scopes}),
        documents=len(scopes),
        facts_added=added_total,
        facts_present=present_total,
        summaries_set=summaries_total,
        files=sum(len(s.files) for s in scopes),
        facts_cut=cut_total,
    )


__all__ = ["DeerFlowImportError", "ImportReport", "fact_from_markdown", "import_folder"]
