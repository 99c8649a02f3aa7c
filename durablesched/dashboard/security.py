"""Who may use the dashboard and how its pages defend themselves.

* **The token.** With one, every request must carry it: ``Authorization: Bearer
  TOKEN``, or the session cookie the login form sets (HttpOnly, SameSite=Strict,
  holding an HMAC of the token, never the token). Both are compared in constant
  time. Without one, the dashboard is for this host only (the CLI refuses any
  other address without a token).
* **CSRF.** Every POST carries a token that must equal the one in the
  ``durablesched_csrf`` cookie (double submit, compared in constant time), and a
  POST whose ``Origin`` names another host is refused: another site can neither
  read the cookie nor send it (SameSite=Strict).
* **Host names.** Without a token, only a request for a loopback name (``localhost``,
  ``127.0.0.1``, ``[::1]``) or one of ``allowed_hosts`` is served: a page of another
  site whose name was rebound to 127.0.0.1 (DNS rebinding) gets a 400, not the queue.
  With a token, the names are checked only when ``allowed_hosts`` is given.
* **Headers.** A CSP that allows this origin's own scripts, styles and images
  only (no inline script or style), ``X-Frame-Options: DENY``, ``nosniff``, a
  strict referrer policy, and no caching of pages.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE = "durablesched_session"
CSRF_COOKIE = "durablesched_csrf"
#: The form field (and header, for scripts) that carries the CSRF token.
CSRF_FIELD = "csrf"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
#: The host names a dashboard without a token answers to (DNS rebinding: docs/dashboard.md).
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
NO_STORE = (b"cache-control", b"no-store")
#: Paths served without the token: the login form and what it needs.
OPEN_PATHS = ("/login", "/static/")


def same(given: str | None, expected: str) -> bool:
    """``given == expected`` in constant time (for equal lengths), False for None or empty."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def session_value(token: str) -> str:
    """What the session cookie holds: the token's HMAC, so the cookie never holds the token."""
    return hmac.new(token.encode(), b"durablesched dashboard session", hashlib.sha256).hexdigest()


def host_name(value: str) -> str:
    """A ``Host`` header's name, lower case, without its port (``[::1]:80`` -> ``[::1]``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def route_path(scope: Scope) -> str:
    """The path inside the dashboard, wherever it is mounted."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def cookies(scope: Scope) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: S112 - a malformed cookie header counts as none
                continue
    return {k: m.value for k, m in jar.items()}


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def cookie_header(scope: Scope, name: str, value: str, *, max_age: int | None = None) -> bytes:
    """A Set-Cookie value: HttpOnly, SameSite=Strict, for the dashboard's path only."""
    path = scope.get("root_path", "") or "/"
    parts = [f"{name}={value}", f"Path={quote(path)}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if scope.get("scheme") == "https":
        parts.append("Secure")
    return "; ".join(parts).encode()


class Guard:
    """ASGI middleware: the token on every request, the CSRF cookie, the headers."""

    def __init__(
        self, app: ASGIApp, token: str | None, allowed_hosts: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.token = token
        self.session = session_value(token) if token else ""
        self.allowed_hosts = frozenset(host_name(h) for h in allowed_hosts)

    def host_allowed(self, scope: Scope) -> bool:
        """Whether the request names a host this dashboard answers to: without a token, a
        loopback name or an allowed one; with a token, any unless some were allowed."""
        if self.token and not self.allowed_hosts:
            return True
        name = host_name(header(scope, b"host") or "")
        return name in self.allowed_hosts or (not self.token and name in LOOPBACK_NAMES)

    def authorised(self, scope: Scope, jar: dict[str, str]) -> bool:
        if not self.token:
            return True
        auth = header(scope, b"authorization") or ""
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer" and same(given.strip(), self.token):
            return True
        return same(jar.get(SESSION_COOKIE), self.session)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.host_allowed(scope):
            await _respond(
                send,
                400,
                b"refused: this dashboard does not answer to that host name "
                b"(see --allowed-host in docs/dashboard.md)\n",
                [(b"content-type", b"text/plain; charset=utf-8"), *HEADERS, NO_STORE],
            )
            return
        jar = cookies(scope)
        csrf = jar.get(CSRF_COOKIE, "")
        new_csrf = None
        if len(csrf) < 32:
            csrf = new_csrf = secrets.token_urlsafe(32)
        scope.setdefault("state", {})["csrf"] = csrf
        scope["state"]["authorised"] = self.authorised(scope, jar)
        scope["state"]["login_needed"] = bool(self.token)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers.extend(h for h in HEADERS if h[0] not in present)
                if b"cache-control" not in present:
                    headers.append((b"cache-control", b"no-store"))
                if new_csrf is not None:
                    headers.append((b"set-cookie", cookie_header(scope, CSRF_COOKIE, new_csrf)))
                message["headers"] = headers
            await send(message)

        path = route_path(scope)
        if not scope["state"]["authorised"] and not path.startswith(OPEN_PATHS):
            await self.refuse(scope, path, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    async def refuse(self, scope: Scope, path: str, send: Send) -> None:
        """A page asked for in a browser goes to the login form; anything else is a 401."""
        accept = header(scope, b"accept") or ""
        fetch = header(scope, b"x-requested-with") is not None
        if scope["method"] == "GET" and "text/html" in accept and not fetch:
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + (f"?{query}" if query else "")
            location = f"{scope.get('root_path', '')}/login?next={quote(target, safe='')}"
            await _respond(send, 303, b"", [(b"location", location.encode())])
            return
        await _respond(
            send,
            401,
            b"the dashboard needs its token: Authorization: Bearer TOKEN, or log in\n",
            [(b"www-authenticate", b"Bearer"), (b"content-type", b"text/plain; charset=utf-8")],
        )


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def safe_next(value: str | None) -> str:
    """Where to go after a login or an action: a path inside the dashboard, never another
    site (``//host`` or a scheme is refused)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value
