"""Who may use the dashboard and how its pages defend themselves.

* **The token.** With one, every request must carry it: ``Authorization: Bearer
  TOKEN``, or the session cookie the login form sets (HttpOnly, SameSite=Strict):
  ``EXPIRY.NONCE.MAC``, a MAC keyed by the token over its expiry and a random
  nonce, never the token. Each login makes a new one; the server refuses it
  after its expiry and after its logout (the nonce is revoked). Wrong tokens are
  counted per client: more than :data:`Throttle.LIMIT` in :data:`Throttle.WINDOW`
  seconds and the client gets a 429 until the oldest ages out. Without a token,
  the dashboard is for this host only (the CLI refuses any other address).
* **CSRF.** Every POST carries a token that is a MAC, keyed by the app's secret
  (derived from the token, or random per process without one), of the browser's
  ``durablesched_csrf`` cookie and its session's nonce: another site can neither
  read the cookie (SameSite=Strict, HttpOnly) nor make a token for a cookie it
  plants. A POST whose ``Origin`` is not this dashboard's (``null`` included) or
  whose ``Sec-Fetch-Site`` is not ``same-origin`` is refused.
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
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

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


#: How long a login lasts (the cookie's Max-Age, and checked by the server).
SESSION_SECONDS = 12 * 3600


def app_key(token: str | None) -> bytes:
    """The key of the app's MACs (sessions, CSRF tokens): derived from the token, so that
    every process serving one dashboard agrees; random per process without a token."""
    if token is None:
        return secrets.token_bytes(32)
    return hmac.new(token.encode(), b"durablesched dashboard key", hashlib.sha256).digest()


class Throttle:
    """Wrong tokens per client: more than :attr:`LIMIT` in :attr:`WINDOW` seconds and the
    client is refused (429) until the oldest of them ages out. Remembers at most
    :attr:`CLIENTS` clients (the longest quiet forgotten first)."""

    LIMIT = 10
    WINDOW = 300.0
    CLIENTS = 10_000

    def __init__(self) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str, now: float) -> float:
        """Seconds until ``client`` may try a token again (0: now)."""
        failures = self._failures.get(client)
        if failures is None:
            return 0.0
        while failures and failures[0] <= now - self.WINDOW:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0.0
        return failures[0] + self.WINDOW - now if len(failures) >= self.LIMIT else 0.0

    def failed(self, client: str, now: float) -> None:
        failures = self._failures.pop(client, None) or deque(maxlen=self.LIMIT)
        failures.append(now)
        self._failures[client] = failures  # the most recent last
        while len(self._failures) > self.CLIENTS:
            self._failures.popitem(last=False)


class Sessions:
    """Login sessions: ``EXPIRY.NONCE.MAC`` cookies, checked for their MAC, their expiry and
    their nonce's revocation (at logout). Revoked nonces are kept until their expiry."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._revoked: dict[str, int] = {}

    def _mac(self, expiry: int, nonce: str) -> str:
        message = f"session|{expiry}|{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def issue(self, now: float) -> str:
        expiry = int(now) + SESSION_SECONDS
        nonce = secrets.token_urlsafe(18)
        return f"{expiry}.{nonce}.{self._mac(expiry, nonce)}"

    def check(self, value: str | None, now: float) -> tuple[str, int] | None:
        """The session's nonce and expiry, or None: forged, expired or logged out."""
        expiry_text, _, rest = (value or "").partition(".")
        nonce, _, mac = rest.partition(".")
        if not (expiry_text.isascii() and expiry_text.isdigit() and len(expiry_text) <= 12):
            return None
        expiry = int(expiry_text)
        if not nonce or not same(mac, self._mac(expiry, nonce)):
            return None
        if expiry <= now or nonce in self._revoked:
            return None
        return nonce, expiry

    def revoke(self, nonce: str, expiry: int, now: float) -> None:
        for old in [n for n, e in self._revoked.items() if e <= now]:
            del self._revoked[old]
        self._revoked[nonce] = expiry


def csrf_token(key: bytes, browser: str, session: str) -> str:
    """The CSRF token of a browser's cookie and its session's nonce (empty: none)."""
    message = f"csrf|{browser}|{session}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def client_of(scope: Scope) -> str:
    """Who is asking, for the throttle: the peer's address (a proxy's, behind one)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def cross_site(scope: Scope) -> str | None:
    """Why a POST must be refused as coming from another site, or None: an ``Origin``
    that is not this dashboard's (``null`` included: a sandboxed frame, a data: page),
    or a ``Sec-Fetch-Site`` other than ``same-origin`` (a browser that sends it says
    where the request comes from, whatever the page claims)."""
    fetch_site = header(scope, b"sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"refused: the request comes from another site (Sec-Fetch-Site: {fetch_site})"
    origin = header(scope, b"origin")
    if origin is None:
        return None
    # Its host and port only: behind a proxy that ends TLS, the scheme differs.
    host = (header(scope, b"host") or "").lower()
    if origin == "null" or "://" not in origin or origin.split("://", 1)[1].lower() != host:
        return "refused: the request comes from another site (its Origin is not this one's)"
    return None


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
    """ASGI middleware: the host name, the token on every request, the CSRF cookie and
    token, the headers on every response (a 500 included)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allowed_hosts: frozenset[str] = frozenset(),
        now: Callable[[], float] = time.time,
        key: bytes | None = None,
        sessions: Sessions | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = frozenset(host_name(h) for h in allowed_hosts)
        self.now = now
        self.key = key if key is not None else app_key(token)
        self.sessions = sessions if sessions is not None else Sessions(self.key)
        self.throttle = throttle if throttle is not None else Throttle()

    def host_allowed(self, scope: Scope) -> bool:
        """Whether the request names a host this dashboard answers to: without a token, a
        loopback name or an allowed one; with a token, any unless some were allowed."""
        if self.token and not self.allowed_hosts:
            return True
        name = host_name(header(scope, b"host") or "")
        return name in self.allowed_hosts or (not self.token and name in LOOPBACK_NAMES)

    def authorise(self, scope: Scope, jar: dict[str, str]) -> tuple[bool, str, float]:
        """Whether the request may pass, its session's nonce (empty: none), and, when its
        client has guessed too often, how many seconds it must wait."""
        if not self.token:
            return True, "", 0.0
        now = self.now()
        session = self.sessions.check(jar.get(SESSION_COOKIE), now)
        if session is not None:
            return True, session[0], 0.0
        auth = header(scope, b"authorization") or ""
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer":
            return False, "", 0.0
        client = client_of(scope)
        wait = self.throttle.wait(client, now)
        if wait:
            return False, "", wait
        if same(given.strip(), self.token):
            return True, "", 0.0
        self.throttle.failed(client, now)
        return False, "", 0.0

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
        browser = jar.get(CSRF_COOKIE, "")
        new_browser = None
        if len(browser) < 32:
            browser = new_browser = secrets.token_urlsafe(32)
        authorised, session, wait = self.authorise(scope, jar)
        state = scope.setdefault("state", {})
        state["csrf"] = csrf_token(self.key, browser, session)
        state["authorised"] = authorised
        state["session"] = session
        state["login_needed"] = bool(self.token)
        state["guard"] = self
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers.extend(h for h in HEADERS if h[0] not in present)
                if b"cache-control" not in present:
                    headers.append(NO_STORE)
                if new_browser is not None:
                    headers.append((b"set-cookie", cookie_header(scope, CSRF_COOKIE, new_browser)))
                message["headers"] = headers
            await send(message)

        path = route_path(scope)
        if wait:
            await self.too_many(wait, send_with_headers)
            return
        if not authorised and not path.startswith(OPEN_PATHS):
            await self.refuse(scope, path, send_with_headers)
            return
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            # The error middleware outside this one would answer without the headers.
            if not started:
                await _respond(
                    send_with_headers,
                    500,
                    b"the dashboard failed to answer: its log says why\n",
                    [(b"content-type", b"text/plain; charset=utf-8")],
                )
            raise

    async def too_many(self, wait: float, send: Send) -> None:
        await _respond(
            send,
            429,
            f"too many wrong tokens from this address: try again in {wait:.0f} s\n".encode(),
            [
                (b"retry-after", str(max(1, round(wait))).encode()),
                (b"content-type", b"text/plain; charset=utf-8"),
            ],
        )

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
