"""The inspector's languages: English (the strings in the templates) and Simplified Chinese (a
gettext catalogue, ``locale/zh_Hans/LC_MESSAGES/messages.po``), chosen by a switch (a cookie) or
else the browser's ``Accept-Language``.

The ``.po`` is compiled with Babel when a language is first used, so a fresh ``pip install``
needs no build step and no compiled ``.mo`` is kept beside its source. ``make i18n`` (pybabel)
extracts the templates' strings into ``messages.pot`` and updates the catalogue.
"""

from __future__ import annotations

import gettext
import io
from importlib.resources import files

LANGUAGES: tuple[tuple[str, str], ...] = (("en", "English"), ("zh-Hans", "简体中文"))
CODES = tuple(code for code, _ in LANGUAGES)
DEFAULT = "en"
COOKIE = "memq_lang"
# The catalogue folder of each language that has one (English is the templates' own text).
_CATALOGUES = {"zh-Hans": "zh_Hans"}


def translations(code: str) -> gettext.NullTranslations:
    """The compiled catalogue of ``code`` (the identity for English)."""
    folder = _CATALOGUES.get(code)
    if folder is None:
        return gettext.NullTranslations()
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    source = files("memq.server.ui").joinpath("locale", folder, "LC_MESSAGES", "messages.po")
    with source.open("rb") as po:
        catalogue = read_po(po, locale=folder)
    compiled = io.BytesIO()
    write_mo(compiled, catalogue)
    compiled.seek(0)
    return gettext.GNUTranslations(compiled)


def _match(tag: str) -> str | None:
    tag = tag.strip().lower().replace("_", "-")
    if not tag:
        return None
    if tag == "en" or tag.startswith("en-"):
        return "en"
    # zh, zh-CN, zh-SG, zh-Hans(-*) read Simplified Chinese; zh-TW/HK/Hant do not.
    if tag == "zh" or tag.startswith(("zh-cn", "zh-sg", "zh-hans")):
        return "zh-Hans"
    return None


def choose(chosen: str | None, accept_language: str | None) -> str:
    """The language a page is shown in: the switch's choice, else the browser's most preferred
    language memq has, else English."""
    if chosen in CODES:
        return str(chosen)
    ranked: list[tuple[float, int, str]] = []
    for index, item in enumerate((accept_language or "").split(",")):
        tag, _, params = item.partition(";")
        weight = 1.0
        if params.strip().startswith("q="):
            try:
                weight = float(params.strip()[2:])
            except ValueError:
                weight = 0.0
        code = _match(tag)
        if code is not None and weight > 0:
            ranked.append((-weight, index, code))
    return min(ranked)[2] if ranked else DEFAULT
