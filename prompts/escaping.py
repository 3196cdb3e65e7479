"""Keeping untrusted text inside the prompt slot it was put in.

Everything we place in a prompt — the update prompt and the ``<user_memory>`` block injected into
the agent's — comes from users or from earlier model output: conversation text, fact contents,
summaries, categories, ids, source errors. Any of it may try to close one of our tags
(``</conversation>``, ``</user_memory>``) and speak as the instructions, or start a line that
looks like one of ours. One policy for every slot:

* JSON slots (the current memory) escape ``<``, ``>`` and ``&`` as JSON ``\\u`` escapes. The JSON
  still means the same strings, so the model reads ``<`` and anything it copies back parses to
  ``<`` again — unlike HTML entities, which DeerFlow's models copied into summaries as ``&quot;``.
* Text slots neutralise only what could start a tag (``<`` before a name, ``/``, ``!`` or ``?``);
  ``a < b`` and ``R&D`` reach the model unchanged. A line break is what ``str.splitlines`` splits
  at (a model reads all of them as one): an item that must stay one line has them folded to a
  space, a message that may span lines has its continuation lines indented.
"""

from __future__ import annotations

import json
import re
from typing import Any

# "< /conversation>" is still a closing tag to a model; "a < b" is a comparison.
_TAG_START = re.compile(r"<(?=\s*/|[!?A-Za-z])")
# Every line boundary str.splitlines knows: CR LF, CR, LF, VT, FF, FS, GS, RS, NEL, LS, PS.
LINE_BREAK = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
_FOLD = re.compile(rf"\s*(?:{LINE_BREAK.pattern})+\s*")


def neutralise_tags(text: str) -> str:
    """Make sure ``text`` cannot open or close a tag of ours; the rest is left as written."""
    return _TAG_START.sub("&lt;", text)


def one_line(text: str) -> str:
    """For list items (``- [id | …] content``): a line break would forge a new item."""
    return _FOLD.sub(" ", neutralise_tags(text)).strip()


def indented(text: str, indent: str = "  ") -> str:
    """For a slot that may span lines (``User: …``): every continuation line is indented, so a
    line that starts at the margin can only be ours."""
    return LINE_BREAK.sub("\n" + indent, neutralise_tags(text))


def prompt_json(data: Any) -> str:
    """Compact JSON, one list item per line, with no raw ``<``, ``>`` or ``&`` anywhere.

    Every extraction pays for the memory in its prompt: a 2-space indent costs about 40 % more
    tokens for the same content, and one fact per line keeps the document readable to the model.
    """
    if isinstance(data, dict):
        parts = []
        for key, value in data.items():
            if isinstance(value, list) and value:
                items = ",\n".join(_compact(item) for item in value)
                parts.append(f"{_compact(key)}:[\n{items}\n]")
            else:
                parts.append(f"{_compact(key)}:{_compact(value)}")
        text = "{\n" + ",\n".join(parts) + "\n}"
    else:
        text = _compact(data)
    # Outside strings JSON never contains these characters, so a plain replace is exact.
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
