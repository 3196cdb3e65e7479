"""Which ``Host`` a server answers to: the one rule of DNS-rebinding protection, for the HTTP
API, the inspector and MCP alike.

A page on another site can point its own host name at 127.0.0.1 (DNS rebinding) and then talk to
a loopback server with the browser's help; it cannot change the ``Host`` header, which names its
site. So a server bound to a loopback address (the default, open without keys) answers only to
loopback names, plus the names configured in ``MEMQ_SERVE_ALLOWED_HOSTS``; a server bound to
another address checks only when names are configured (a proxy in front should then set them).
Other requests get 421, as the MCP SDK answers them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from memq.core.settings import MemqSettings
from memq.server.auth import is_loopback
from memq.server.problems import problem

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# Probes a load balancer sends with whatever Host it likes; they read nothing.
_UNCHECKED_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """Host names (``name`` matches any port, ``name:port`` that port only)."""

    names: tuple[str, ...]

    def allows(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name, port = _split(host_header.strip().lower())
        if port is not None and not port.isdigit():
            return False
        for allowed in self.names:
            allowed_name, allowed_port = _split(allowed)
            if allowed_name == name and allowed_port in (None, port):
                return True
        return False

    def transport_security(self) -> TransportSecuritySettings:
        """The same rule for the MCP SDK's own check at ``/mcp`` (its patterns: ``host:*``)."""
        hosts = [
            pattern
            for name in self.names
            for pattern in ((name,) if _split(name)[1] else (name, f"{name}:*"))
        ]
        origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )


def _split(host: str) -> tuple[str, str | None]:
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else None
    name, sep, port = host.rpartition(":")
    return (name, port) if sep else (host, None)


def allowed_hosts(settings: MemqSettings) -> AllowedHosts | None:
    """The names this server answers to, or None when it checks no Host (bound to a
    non-loopback address with no names configured)."""
    configured = tuple(h.strip().lower() for h in settings.serve_allowed_hosts if h.strip())
    bound = settings.serve_host
    if not configured and not is_loopback(bound):
        return None
    own = (f"[{bound}]" if ":" in bound else bound,) if is_loopback(bound) else ()
    return AllowedHosts(tuple(dict.fromkeys(LOOPBACK_NAMES + own + configured)))


class HostGuard:
    """421 for a request whose ``Host`` is not allowed (every route but the health probes)."""

    def __init__(self, app: ASGIApp, *, allowed: AllowedHosts, root_path: str = "") -> None:
        self.app = app
        self.allowed = allowed
        self.root_path = root_path.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = str(scope.get("path", ""))
            if self.root_path and path.startswith(self.root_path):
                path = path[len(self.root_path) :]
            if path not in _UNCHECKED_PATHS:
                host = next((v for k, v in scope.get("headers", ()) if k == b"host"), b"")
                if not self.allowed.allows(host.decode("latin-1")):
                    # The header is not echoed: it is the caller's text.
                    detail = (
                        "this server does not answer to that Host header (DNS rebinding "
                        "protection); add the name to MEMQ_SERVE_ALLOWED_HOSTS"
                    )
                    await problem(421, detail)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
