"""Upload mentions are session-only: an uploaded file is gone in the next thread, so a memory
saying "the user uploaded report.pdf" sends the agent looking for a file that does not exist.

Sentences of summaries that mention an upload are deleted; facts that mention one are dropped.
Unlike DeerFlow's pattern this also catches a path or tag at the start of a word ("See
/mnt/user-data/uploads/x"), "uploads file", "uploaded report.pdf", up to six words in between
("uploaded the big quarterly sales file"), file names with dots inside a sentence, and Chinese
upload phrases — while "works with CSV files" and "prefers PDF export" stay. Manual facts are the
user's own words and are left alone.
"""

from __future__ import annotations

import re

from memq.memory.blocks import UPLOAD_TAGS
from storage.base import Change
from storage.document import MemoryDocument, copy_document
from storage.sections import HISTORY_SECTIONS, USER_SECTIONS, Section

UPLOAD_MENTION = re.compile(
    r"\bupload(?:s|ed|ing)?\b(?:\s+[\w'’-]+){0,6}?\s+(?:files?|documents?|attachments?)\b"
    r"|\bupload(?:s|ed|ing)?\s+(?:[\w'’-]+\s+){0,3}?[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4}\b"  # a.pdf
    r"|\bfile\s+uploads?\b"
    r"|/mnt/user-data/uploads\b"
    rf"|</?(?:{'|'.join(UPLOAD_TAGS)})>"
    r"|上传(?:了|的)?[^。！？.!?]{0,20}?(?:文件|文档|附件)",
    re.IGNORECASE,
)
# A sentence ends at . ! ? followed by whitespace or the end (so "data.csv" and "v2.0" stay inside
# it), or at a Chinese full stop, exclamation or question mark.
_SENTENCE = re.compile(r"(?:[^.!?。！？]|[.!?](?=[^\s.!?]))*(?:[.!?]+(?=\s|$)|[。！？]+)?\s*")
_SPACES = re.compile(r"[ \t]{2,}")
_REASON = "mentions an uploaded file (uploads are session-only)"


# Every branch of the pattern spells one of these (in any case): a substring test rules out most
# text at a fraction of the pattern's cost, and every fact is checked on each run.
_MUST_CONTAIN = tuple(dict.fromkeys(("upload", "上传", *UPLOAD_TAGS)))


def mentions_upload(text: str) -> bool:
    lowered = text.lower()
    if not any(word in lowered for word in _MUST_CONTAIN):
        return False
    return UPLOAD_MENTION.search(text) is not None


def scrub_text(text: str) -> str:
    """``text`` without the sentences that mention an upload."""
    if not mentions_upload(text):
        return text
    kept = [s for s in _SENTENCE.findall(text) if s and not mentions_upload(s)]
    return _SPACES.sub(" ", "".join(kept)).strip()


def scrub_document(
    document: MemoryDocument, *, source_thread_id: str | None = None
) -> tuple[MemoryDocument, list[Change]]:
    """A copy of ``document`` without upload mentions, and what was taken out."""
    return scrub_own_document(copy_document(document), source_thread_id=source_thread_id)


def scrub_own_document(
    doc: MemoryDocument, *, source_thread_id: str | None = None
) -> tuple[MemoryDocument, list[Change]]:
    """:func:`scrub_document` on a document the caller owns (its private copy): changed in
    place, no second copy."""
    changes: list[Change] = []
    for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
        container = getattr(doc, group)
        for name in names:
            section: Section = getattr(container, name)
            cleaned = scrub_text(section.summary)
            if cleaned != section.summary:
                setattr(container, name, Section(summary=cleaned, updated_at=section.updated_at))
                changes.append(
                    Change(
                        action="summary",
                        section=name,
                        content=cleaned,
                        reason=_REASON,
                        source_thread_id=source_thread_id,
                    )
                )
    kept = []
    for fact in doc.facts:
        if fact.source != "manual" and mentions_upload(fact.content):
            changes.append(
                Change(
                    action="remove",
                    fact_id=fact.id,
                    content=fact.content,
                    reason=_REASON,
                    source_thread_id=source_thread_id,
                )
            )
        else:
            kept.append(fact)
    doc.facts = kept
    return doc, changes
