"""How a pending context accumulates what it is handed: the merge of two message lists.

A context waits in Redis (or in the producer's spool) until a worker extracts it. Meanwhile the
agent may hand over a list that no longer holds messages it handed over before — it summarised
its history, truncated it, or edited its last turn. Replacing the stored list would lose those
messages before anyone extracted them, so the two lists are merged instead:

- the newer list is the agent's current view: all of it is kept, in its order;
- a stored message it no longer holds is kept too, in the stored order: before the newer list
  when some later stored message is still in the newer list (summarisation dropped the front),
  right after the last stored message the newer list still holds when none is (the tail was
  edited or cut), so it never lands before messages that are older than it;
- messages are the same when their ids are, else when role and content are (a fingerprint), so a
  re-sent message is never kept twice.

``enqueue.lua`` applies the same rule inside Redis; this is the reference the spool uses and both
are tested against the same cases. The common cases cost string comparisons, no decoding: the
newer list starts with the stored one (a turn appended), or with its end (a turn appended and the
front dropped by the producer's size cap, or the turn after a merge).
"""

from __future__ import annotations

from collections.abc import Sequence

from memq.core.models import Message, messages_from_json, messages_to_json

Identity = tuple[str, ...]


def identity(message: Message) -> Identity:
    """What makes two handed-over messages the same one: the id, else role and content."""
    if message.id:
        return ("id", message.id)
    return ("fp", message.role, message.content)


def merge_messages(older: Sequence[Message], newer: Sequence[Message]) -> list[Message]:
    """``newer`` with every message of ``older`` it does not hold (see the module docstring).

    When ``newer`` starts with the end of ``older`` — from the first message of ``older`` after
    its head that equals ``newer``'s first — the rest of ``older`` is kept before it as it is: the
    agent appended turns and its size cap dropped the front. (``enqueue.lua`` sees this case
    without decoding; it is also what the general rule gives, except that the front is kept
    whole even where a message in it repeats one in ``newer``.)
    """
    if not older or list(newer[: len(older)]) == list(older):
        return list(newer)  # the agent appended turns (or re-sent the same)
    if newer:
        start = next((i for i in range(1, len(older)) if older[i] == newer[0]), 0)
        if start and list(older[start:]) == list(newer[: len(older) - start]):
            return [*older[:start], *newer]
    held = {identity(m) for m in newer}
    last_held = -1
    for index in range(len(older) - 1, -1, -1):
        if identity(older[index]) in held:
            last_held = index
            break
    if last_held < 0:
        return [*older, *newer]
    head = [m for m in older[:last_held] if identity(m) not in held]
    tail = list(older[last_held + 1 :])
    if not head and not tail:
        return list(newer)
    anchor = identity(older[last_held])
    at = next(i for i, m in enumerate(newer) if identity(m) == anchor) + 1
    return [*head, *newer[:at], *tail, *newer[at:]]


def extends(older_json: str, newer_json: str) -> bool:
    """Whether the encoded ``newer`` list starts with every message of the encoded ``older`` one
    (the agent only appended): then ``newer`` is the merge, with no decoding."""
    if older_json == newer_json:
        return True
    if not older_json.endswith("]") or len(older_json) >= len(newer_json):
        return False
    body = older_json[:-1]
    return newer_json.startswith(body) and newer_json[len(body)] == ","


_ELEMENT = b'},{"role":"'
_ROLE_KEY = b'"role":'


def newest_within(list_json: str, max_bytes: int | None) -> tuple[str, int]:
    """The newest messages of an encoded list within ``max_bytes`` of UTF-8, and how many were
    cut: what ``enqueue.lua`` does past ``context_max_bytes``, found the same way (by the element
    boundary of the producer's encoding, never by decoding). A list in another encoding, or whose
    newest message alone is too long, is cut whole."""
    if max_bytes is None or len(list_json) <= max_bytes // 4:
        return list_json, 0  # even at 4 bytes a character it fits
    raw = list_json.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return list_json, 0
    at = -1
    if raw.startswith(b'[{"role":"'):
        at = raw.find(_ELEMENT, max(1, len(raw) - max_bytes - 1))
    if at < 0:
        return "[]", raw.count(_ROLE_KEY)
    kept = b"[" + raw[at + 2 :]
    return kept.decode("utf-8", "surrogatepass"), raw[: at + 1].count(_ROLE_KEY)


def merge_within(older_json: str, newer_json: str, max_bytes: int | None) -> tuple[str, int]:
    """:func:`merge_messages_json` under a hard cap, as ``enqueue.lua`` applies it: each list is
    cut to ``max_bytes`` before anything is decoded, and so is the merge; with how many messages
    were cut."""
    older, cut_older = newest_within(older_json, max_bytes)
    newer, cut_newer = newest_within(newer_json, max_bytes)
    merged, cut_merged = newest_within(merge_messages_json(older, newer), max_bytes)
    return merged, cut_older + cut_newer + cut_merged


def merge_messages_json(older_json: str, newer_json: str) -> str:
    """:func:`merge_messages` on the JSON lists the queue stores; ``newer_json`` as it is when
    it already holds everything (the common case), or when ``older_json`` cannot be read (a
    list that cannot be decoded has nothing to contribute)."""
    if extends(older_json, newer_json):
        return newer_json
    try:
        older = messages_from_json(older_json)
        newer = messages_from_json(newer_json)
    except (ValueError, TypeError):
        return newer_json
    merged = merge_messages(older, newer)
    if len(merged) == len(newer):
        return newer_json
    return messages_to_json(merged)
