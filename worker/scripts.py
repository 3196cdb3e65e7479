"""Lua scripts assembled from shared fragments when they are loaded, as BullMQ's script loader does.

Steps several scripts take the same way (releasing a claim, requeueing, dead-lettering) live once,
as a local function in ``includes/<name>.lua`` next to the scripts, so one fix reaches every script.
A script pulls a fragment with a line of its own::

    --- @include "includes/release_claim"

The line is replaced by the fragment's text (``.lua`` may be left out). Each fragment is inlined
once per script, at its first include; a fragment may include others, which are inlined before it.
The result is plain Lua that ``register_script`` loads like any other: Redis only ever sees the
assembled text. A missing fragment or an include cycle is a packaging bug, raised at load.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

from memq.core.errors import MemqError

# BullMQ's include syntax: two or three dashes, @include, a quoted path, nothing else on the line.
INCLUDE_LINE = re.compile(r"^-{2,3}[ \t]*@include[ \t]+([\"'])(.+?)\1[; \t]*$", re.MULTILINE)


class ScriptAssemblyError(MemqError, LookupError):
    """A Lua script includes a fragment that does not exist, or fragments include each other."""


def _file_name(reference: str) -> str:
    return reference if reference.endswith(".lua") else f"{reference}.lua"


def _read(root: Traversable, path: str, by: str) -> str:
    target = root.joinpath(*path.split("/"))
    if not target.is_file():
        raise ScriptAssemblyError(f"{by}: included Lua fragment {path!r} does not exist")
    return target.read_text(encoding="utf-8")


def _inline(
    root: Traversable, path: str, text: str, done: list[str], stack: tuple[str, ...]
) -> str:
    def replace(match: re.Match[str]) -> str:
        include = _file_name(match.group(2))
        if include in stack:
            raise ScriptAssemblyError(f"Lua include cycle: {' -> '.join((*stack, include))}")
        if include in done:
            return ""
        done.append(include)
        source = _read(root, include, path)
        return _inline(root, include, source, done, (*stack, include)).rstrip("\n")

    return INCLUDE_LINE.sub(replace, text)


def assemble_with_includes(package: str, name: str) -> tuple[str, tuple[str, ...]]:
    """Script ``<name>.lua`` of ``package`` with its includes inlined, and the fragments it
    pulled (paths relative to the package, in the order they were inlined)."""
    root = resources.files(package)
    path = _file_name(name)
    done: list[str] = []
    source = _inline(root, path, _read(root, path, package), done, (path,))
    return source, tuple(done)


def assemble(package: str, name: str) -> str:
    """The source to register for script ``<name>.lua`` of ``package``."""
    return assemble_with_includes(package, name)[0]
