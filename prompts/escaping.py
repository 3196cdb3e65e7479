"""Keeping untrusted text inside the prompt slot it was put in.

Everything we place in a prompt — the update prompt and the ``<user_memory>`` block injected into
the agent's — comes from users or from earlier model output: conversation text, fact contents,
summaries, categories, ids, source errors. Any of it may try to close one of our tags
(``</conversation>``, ``</user_memory>``) and speak as the instructions, or start a line that
looks like one of ours. One policy for every slot:

* JSON slots (the current memory) escape ``<``, ``>`` and ``&`` as JSON ``\\u`` escapes. The JSON
  still means the same strings, so the model reads ``<`` and anything it copies back parses to
  ``<`` again — unlike HTML entities, which DeerFlow's models copied into summaries as ``&quot;``.
* Text slots neutralise only what could start a tag (a ``<`` before a name, ``/``, ``!`` or
  ``?``, as ``&lt;``); ``a < b`` and ``R&D`` reach the model unchanged. A line break is what
  ``str.splitlines`` splits at (a model reads all of them as one): an item that must stay one
  line has them folded to a space, a message that may span lines has its continuation lines
  indented.

A model does not read code points, it reads what they look like: ``<\\u200b/user_memory>``,
``＜/user_memory＞`` and ``‹/user_memory›`` all close the block to it. So text slots first drop
invisible characters (format characters, Unicode category Cf, and the other default-ignorables),
keeping only the joiners and variation selectors that scripts and emoji need; then every
``<``-like character (``<`` and whatever folds or looks like it) that starts something tag-like is
neutralised, looking past joiners and combining marks. ``<`` and its NFKC forms stay only before
a space (not followed by a slash), a digit, ASCII punctuation or the end, so ``a < b`` and
``x <= 3`` stay; the mere lookalikes only count before a Latin letter, ``!``, ``?`` or a slash, so
``〈論文〉`` stays; Chinese, emoji and accents are never touched. JSON slots ``\\u``-escape the
same characters instead, so their strings still mean exactly what was stored.
"""

from __future__ import annotations

import json
import re
from typing import Any

# `regex`, not `re`: it knows Unicode properties (Cf, default-ignorable, marks).
import regex

# Characters that are, fold to (NFKC) or look like "<" and ">", and like "/" after a space.
LT_LIKE = "<\ufe64\uff1c\u2039\u2329\u3008\u27e8\u276c\u276e\u2770\u02c2\u1438\u29fc"
GT_LIKE = ">\ufe65\uff1e\u203a\u232a\u3009\u27e9\u276d\u276f\u2771\u02c3\u1433\u29fd"
_SLASH_LIKE = "/\uff0f\u2215\u2044\u29f8"
# Invisible: format characters and default-ignorables, less what Persian, Indic scripts and emoji
# need (the joiners, variation selectors); those are looked past instead.
_INVISIBLE_CLASS = r"[[\p{Cf}\p{DI}]--[\u200c\u200d\p{Variation_Selector}]]"
_INVISIBLE = regex.compile(_INVISIBLE_CLASS, regex.V1)
_PAST = r"[\u200c\u200d\p{M}]"  # joiners and combining marks (variation selectors are marks)
# What may follow a "<" that is not a tag: a space (unless a slash comes next), a digit, ASCII
# punctuation other than "/", "!" and "?", or the end. Anything else (a letter of any script, a
# full-width or mathematical form, a symbol) is treated as a tag name.
_NOT_A_TAG = r"[\s0-9=<>\-+*().,;:|'\"\[\]{}$%&^~`@#_\\]"
# "<" itself and its NFKC forms open a tag before anything else; the mere lookalikes (also CJK
# title brackets: 〈論文〉) only before a Latin letter, "!" or "?".
_LT_FOLDS = "<\ufe64\uff1c"
_LOOKALIKES = LT_LIKE.removeprefix(_LT_FOLDS)
_TAG_START = regex.compile(
    rf"(?:[{_LT_FOLDS}](?={_PAST}*+(?!{_NOT_A_TAG}|\Z))"
    rf"|[{_LOOKALIKES}](?={_PAST}*+[A-Za-z\uff21-\uff3a\uff41-\uff5a!?\uff01\uff1f]))"
    rf"|[{LT_LIKE}](?=(?:\s|{_PAST})*+[{_SLASH_LIKE}])"
)
_JSON_UNSAFE = regex.compile(rf"[&{LT_LIKE}{GT_LIKE}]|{_INVISIBLE_CLASS}|[\ud800-\udfff]", regex.V1)
# Every line boundary str.splitlines knows: CR LF, CR, LF, VT, FF, FS, GS, RS, NEL, LS, PS.
LINE_BREAK = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
_FOLD = re.compile(rf"\s*(?:{LINE_BREAK.pattern})+\s*")


def neutralise_tags(text: str) -> str:
    """Make sure ``text`` cannot open or close a tag of ours, nor hide anything from a reader:
    invisible characters are dropped, tag-like openings neutralised, the rest left as written."""
    if text.isascii():  # the common case: no invisible or lookalike character to look for
        return _TAG_START.sub("&lt;", text) if "<" in text else text
    return _TAG_START.sub("&lt;", _INVISIBLE.sub("", text))


def one_line(text: str) -> str:
    """For list items (``- [id | …] content``): a line break would forge a new item."""
    text = neutralise_tags(text)
    # Every line break is a control or separator character, which isprintable() rejects: text
    # without one (nearly every fact) skips the fold, the costliest step of the injected block.
    return text.strip() if text.isprintable() else _FOLD.sub(" ", text).strip()


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
    # Outside strings JSON never contains these characters, so escaping them is exact.
    if text.isascii():
        # No invisible, lookalike or surrogate character can be in ASCII text: only the three
        # ASCII ones remain, and str.replace is far cheaper than the Unicode-aware pattern over a
        # memory of thousands of tokens.
        return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    return _JSON_UNSAFE.sub(_json_escape, text)


def _json_escape(match: regex.Match[str]) -> str:
    point = ord(match.group())
    if point < 0x10000:
        return f"\\u{point:04x}"
    point -= 0x10000  # a UTF-16 surrogate pair, as JSON spells characters beyond the BMP
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


# One encoder for every call: ``json.dumps`` with options builds a new encoder each time, a good
# part of the cost for the dozens of small items of a memory.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _compact(data: Any) -> str:
    return _COMPACT.encode(data)
