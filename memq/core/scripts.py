"""The one loader of memq's Lua scripts: read with ``importlib.resources``, assembled from shared
fragments as BullMQ's script loader does, registered once per client and kept on the instance.

Each script lives next to the module that calls it (``producer/enqueue.lua``,
``storage/save_document.lua``, ``worker/complete.lua``, ...). Steps several scripts take the same
way (releasing a claim, requeueing, dead-lettering) live once, as a local function in
``memq/core/includes/<name>.lua``, so one fix reaches every script, whichever package it is in. A
script pulls a fragment with a line of its own::

    --- @include "includes/release_claim"

The line is replaced by the fragment's text (``.lua`` may be left out). The path is looked up in
the script's own package first, then among the shared fragments here. Each fragment is inlined
once per script, at its first include; a fragment may include others, which are inlined before it.
The result is plain Lua that ``register_script`` loads like any other: Redis only ever sees the
assembled text. A missing fragment or an include cycle is a packaging bug, raised at load.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any, Protocol

import redis
from redis.exceptions import NoScriptError

from memq.core.errors import MemqError

if TYPE_CHECKING:
    from redis.commands.core import Script

    from memq.core.connection import RedisClient

log = logging.getLogger("memq.scripts")

SHARED_FRAGMENTS = "memq.core"  # the package whose ``includes/`` every script may pull from

# BullMQ's include syntax: two or three dashes, @include, a quoted path, nothing else on the line.
INCLUDE_LINE = re.compile(r"^-{2,3}[ \t]*@include[ \t]+([\"'])(.+?)\1[; \t]*$", re.MULTILINE)


class ScriptAssemblyError(MemqError, LookupError):
    """A Lua script includes a fragment that does not exist, or fragments include each other."""


def _file_name(reference: str) -> str:
    return reference if reference.endswith(".lua") else f"{reference}.lua"


def _read(root: Traversable, path: str, by: str) -> str:
    for base in (root, resources.files(SHARED_FRAGMENTS)):
        target = base.joinpath(*path.split("/"))
        if target.is_file():
            return target.read_text(encoding="utf-8")
    raise ScriptAssemblyError(f"{by}: included Lua fragment {path!r} does not exist")


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


@functools.cache
def assemble(package: str, name: str) -> str:
    """The source to register for script ``<name>.lua`` of ``package`` (read once per process:
    it is package data, the same for every client)."""
    return assemble_with_includes(package, name)[0]


class LuaScripts:
    """Scripts of one package registered on one client, once each: build it with the client and
    keep it beside it (``register_script`` only hashes the text; EVALSHA loads it on first use)."""

    def __init__(self, client: RedisClient, package: str, names: Iterable[str]) -> None:
        self._scripts = {name: client.register_script(assemble(package, name)) for name in names}

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]


def register(client: RedisClient, package: str, name: str) -> Script:
    """The one script ``<name>.lua`` of ``package``, registered on ``client``."""
    return LuaScripts(client, package, (name,))[name]


# Queues more commands on a pipeline; False when it queued none (the caller then sends its own).
AlsoQueue = Callable[[Any], bool]


class AlsoRead(Protocol):
    """A read sent in someone else's pipeline: ``queue`` puts its one command on it (False: none
    queued), ``take`` is handed that command's reply (an exception object when it failed)."""

    def queue(self, pipe: Any) -> bool: ...

    def take(self, reply: Any) -> None: ...


def call_then(
    client: RedisClient,
    script: Script,
    keys: Sequence[Any],
    args: Sequence[Any],
    also: AlsoQueue | None,
) -> Any:
    """``script(keys, args)``'s reply, with the commands ``also`` queues sent after it in the same
    round trip (a plain pipeline, no MULTI: the script's writes never wait on theirs, nor fail
    with them). Their replies are dropped: what ``also`` sends is a best effort (metrics), the
    script's reply is the answer, raised when it is an error. A Redis that forgot the script
    (restarted) runs it through the wrapper, which loads it; ``also``'s commands, already run,
    are not sent again. On a cluster client ``also`` is not called: its keys may sit on another
    node, and the caller sends them itself."""
    if also is None or not isinstance(client, redis.Redis):
        return script(keys=keys, args=args)
    pipe = client.pipeline(transaction=False)
    # EVALSHA itself: redis-py's Script in a pipeline asks SCRIPT EXISTS first, a round trip.
    pipe.evalsha(script.sha, len(keys), *keys, *args)
    if not also(pipe):
        pipe.reset()
        return script(keys=keys, args=args)
    reply, *rest = pipe.execute(raise_on_error=False)
    for extra in rest:
        if isinstance(extra, Exception):
            log.debug("a command sent with a script failed: %s", extra)
    if isinstance(reply, NoScriptError):
        return script(keys=keys, args=args)
    if isinstance(reply, Exception):
        raise reply
    return reply
