"""Self-introductions for the offline extractor: "I'm Carol, a nurse living in Toronto",
"My name is Ana", "我是王伟，一名后端工程师", "我叫李娜".

A name is only taken where the sentence says it is one: after "my name is" / "call me" / "我叫",
or "I'm X" / "我是X" followed by a description (", a nurse", "，一名工程师"). "I'm French" or
"我是学生" are a nationality and a role, not names. One introduction may give two facts: the
name, and what follows it.
"""

from __future__ import annotations

import re

from memq.memory.update import NewFact

_EN_NAME = r"(?P<name>[A-Z][a-z'’-]+(?: [A-Z][a-z'’-]+)?)"
# "I'm Carol, a nurse …", "I'm Carol from Lyon", "I'm Carol." (capitalised: a name, not a state)
_EN_IM = re.compile(
    r"(?:^|[\s,])(?:[Ii]['’]m|[Ii] am) " + _EN_NAME + r"(?P<rest>\s*,\s*.+|\s+from\s+.+)?$"
)
_EN_NAMED = re.compile(
    r"\b(?:[Mm]y name is|[Cc]all me|[Mm]y name['’]s) " + _EN_NAME + r"(?P<rest>\s*,\s*.+)?$"
)
_EN_ROLE = re.compile(r"^(?:and )?(?:i['’]m |i am )?(?P<role>(?:a|an) [a-z][\w ,-]{2,80})$", re.I)
_EN_FROM = re.compile(r"^(?:and )?(?:i['’]m |i am )?from (?P<place>[A-Z][\w ,'’-]{1,60})$")
# "…, a nurse in Toronto, and I prefer tea": the description ends where the next clause starts.
_EN_NEXT_CLAUSE = re.compile(r",?\s+(?:and|but)\s+(?:i|i['’]m|my)\b", re.I)
# Capitalised words that follow "I'm" without being names.
_NOT_NAMES = frozenset(
    {
        "Sorry",
        "Fine",
        "Okay",
        "Ok",
        "Ready",
        "Done",
        "Back",
        "Here",
        "Not",
        "Just",
        "So",
        "Also",
        "Still",
        "Really",
        "Very",
        "Happy",
        "Glad",
        "Good",
        "Tired",
        "Busy",
        "Sure",
        "The",
        "A",
        "An",
        "English",
        "French",
        "German",
        "Chinese",
        "Japanese",
        "Korean",
        "American",
        "Canadian",
        "British",
        "Indian",
        "Spanish",
        "Italian",
        "Russian",
        "Brazilian",
        "Mexican",
        "Dutch",
        "Swedish",
        "Norwegian",
        "Danish",
        "Finnish",
        "Polish",
        "Swiss",
        "Austrian",
        "Irish",
        "Scottish",
        "Australian",
        "Vietnamese",
        "Thai",
        "Turkish",
        "Greek",
        "Portuguese",
        "Christian",
        "Muslim",
        "Jewish",
        "Buddhist",
        "Hindu",
        "Catholic",
        "Vegan",
        "Vegetarian",
    }
)

_ZH_NAME = r"(?P<name>[\u4e00-\u9fff]{2,4})"
_ZH_IS = re.compile(r"我是" + _ZH_NAME + r"[，,]\s*(?P<rest>.+)$")
_ZH_CALLED = re.compile(
    r"(?:我叫|我的名字是|我的名字叫)" + _ZH_NAME + r"(?:[，,]\s*(?P<rest>.+))?$"
)
# Role words: "我是学生，…" says what the user is, not who.
_ZH_ROLE_END = re.compile(r"[师员者生家工长手人]$")
_ZH_ROLE = re.compile(r"^(?:我是)?(?:一名|一个|一位|个)(?P<role>.+)$")
_ZH_PLACE = re.compile(r"^(?:我)?(?:住在|来自|在)(?P<place>.+)$")
_TRAILING = re.compile(r"[\s.,!;:。，！；：]+$")


def _fact(content: str, confidence: float = 0.9) -> NewFact:
    return NewFact(content=content, category="context", confidence=confidence)


def _english(sentence: str) -> list[NewFact]:
    found = _EN_NAMED.search(sentence) or _EN_IM.search(sentence)
    if found is None:
        return []
    name = found.group("name")
    if name.split()[0] in _NOT_NAMES:
        return []
    facts = [_fact(f"User's name is {name}", 0.95)]
    rest = (found.group("rest") or "").strip().lstrip(",").strip()
    rest = _TRAILING.sub("", _EN_NEXT_CLAUSE.split(rest, maxsplit=1)[0])
    role, place = _EN_ROLE.match(rest), _EN_FROM.match(rest)
    if role is not None:
        facts.append(_fact(f"User is {role.group('role')}"))
    elif place is not None:
        facts.append(_fact(f"User is from {place.group('place')}"))
    return facts


def _chinese(sentence: str) -> list[NewFact]:
    found = _ZH_CALLED.search(sentence)
    if found is None:
        found = _ZH_IS.search(sentence)
        if found is None or _ZH_ROLE_END.search(found.group("name")):
            return []
    facts = [_fact(f"用户叫{found.group('name')}", 0.95)]
    rest = _TRAILING.sub("", (found.group("rest") or "").strip())
    role, place = _ZH_ROLE.match(rest), _ZH_PLACE.match(rest)
    if role is not None:
        facts.append(_fact(f"用户是{role.group('role')}"))
    elif place is not None:
        facts.append(_fact(f"用户住在{place.group('place')}"))
    return facts


def introduction_facts(sentence: str) -> list[NewFact]:
    """The facts of a self-introduction (name first), or [] when the sentence is not one."""
    sentence = _TRAILING.sub("", sentence)
    return _english(sentence) or _chinese(sentence)
