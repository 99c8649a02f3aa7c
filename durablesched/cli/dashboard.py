"""``durablesched dashboard``: serve the web dashboard (docs/dashboard.md) with uvicorn.

Safe by default: it listens on 127.0.0.1; any other address needs ``--token`` (or
``DURABLESCHED_DASHBOARD_TOKEN``), which every request must then carry. The
dashboard's packages are imported only here, when the command runs: a missing
extra is one line (exit 2) naming it.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
from typing import TYPE_CHECKING

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, UsageError
from durablesched.cli.options import Commands, Repeated, option, switch
from durablesched.cli.values import positive_int
from durablesched.errors import ConfigurationError

if TYPE_CHECKING:
    from types import ModuleType

#: What the dashboard needs installed, said in one line.
MISSING_EXTRA = "the dashboard needs its extra: pip install 'durablesched[dashboard]'"


def register(commands: Commands) -> None:
    p = commands.add("dashboard", cmd_dashboard, "serve the web dashboard until stopped")
    option(
        p,
        "--host",
        variable="dashboard_host",
        help="the address to listen on; any but this host's needs --token",
    )
    option(p, "--port", variable="dashboard_port", help="the port to listen on")
    option(
        p,
        "--token",
        variable="dashboard_token",
        help="every request must carry it (Authorization: Bearer, or the login form's "
        "cookie); it shows in ps: prefer the variable or --token-file",
    )
    option(
        p,
        "--token-file",
        variable="dashboard_token_file",
        help="a file that holds the token (its first line), instead of --token",
    )
    option(
        p,
        "--allowed-host",
        variable="dashboard_allowed_host",
        action=Repeated,
        help="a host name the dashboard answers to besides localhost, 127.0.0.1 and [::1] "
        "(the name a proxy in front of it is asked for; again for more, or comma-separated)",
    )
    switch(
        p,
        "--read-only",
        variable="dashboard_read_only",
        help="hide and refuse every action, and open the database read-only",
    )


def loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: The shortest token that may guard a dashboard listening beyond this machine, and the
#: fewest different characters it must hold (``aaaa...`` or ``1212...`` are no secret).
MIN_TOKEN_LENGTH = 16
MIN_TOKEN_CHARACTERS = 8
#: How to make a good token, said when one is refused.
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe())'"  # noqa: S105


def weak(token: str) -> str | None:
    """Why ``token`` is too weak to guard a dashboard others can reach, or None."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"it has {len(token)} characters, fewer than {MIN_TOKEN_LENGTH}"
    if len(set(token)) < MIN_TOKEN_CHARACTERS:
        return f"it has only {len(set(token))} different characters"
    return None


def read_token(args: argparse.Namespace) -> str | None:
    """The token of ``--token`` (or its variable) or of ``--token-file``: not both."""
    token: str | None = args.token or None
    if args.token_file:
        if token is not None:
            raise UsageError("give the token once: --token (or its variable) or --token-file")
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise UsageError(f"--token-file {args.token_file} cannot be read: {reason}") from None
        if not token:
            raise UsageError(f"--token-file {args.token_file} holds no token (its first line)")
    if token is not None and not token.strip():
        raise UsageError("--token must not be empty")
    return token


def cmd_dashboard(args: argparse.Namespace) -> int:
    port = positive_int("--port", args.port, maximum=65535)
    token = read_token(args)
    if not loopback(args.host) and token is None:
        raise UsageError(
            f"--host {args.host} listens beyond this machine: give --token (or set "
            "DURABLESCHED_DASHBOARD_TOKEN, or --token-file), which every request must then carry"
        )
    problem = None if token is None or loopback(args.host) else weak(token)
    if problem is not None:
        raise UsageError(
            f"the token is too weak for --host {args.host} ({problem}): use at least "
            f"{MIN_TOKEN_LENGTH} random characters, such as: {MAKE_TOKEN}"
        )
    allowed = [h.strip() for h in (args.allowed_host or "").split(",") if h.strip()]
    if loopback(args.host):  # an address of its own (127.0.0.2) is no name to rebind
        allowed.append(f"[{args.host.strip('[]')}]" if ":" in args.host else args.host)
    dashboard, uvicorn = _modules()
    with _listen(args.host, port) as sock:
        # A reader: a mistyped --db is exit 2, not a new, empty database to look at.
        store = open_db(args, readonly=args.read_only, create=False)
        try:
            app = dashboard.create_app(
                store, token=token, read_only=args.read_only, allowed_hosts=allowed
            )
            config = uvicorn.Config(app, log_level="warning", access_log=False)
            # Listening already: a request sent once this line is out waits in the backlog.
            shown = f"[{args.host}]" if ":" in args.host else args.host
            print(f"serving the dashboard at http://{shown}:{port}/ (Ctrl-C stops it)", flush=True)
            # uvicorn stops on SIGTERM or SIGINT, then raises the signal again for the
            # handler it found: this one lets the command end cleanly (exit 0). The
            # caller's own handlers come back after (main() may run in a longer process).
            signals = (signal.SIGTERM, signal.SIGINT)
            previous = {sig: signal.signal(sig, lambda _signum, _frame: None) for sig in signals}
            try:
                uvicorn.Server(config).run(sockets=[sock])
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        finally:
            store.close()
    return EXIT_OK


def _modules() -> tuple[ModuleType, ModuleType]:
    """durablesched.dashboard and uvicorn, or exit 2 naming the extra to install."""
    try:
        import uvicorn

        import durablesched.dashboard as dashboard  # noqa: PLR0402 - the package, not a name
    except (ConfigurationError, ImportError):
        raise UsageError(MISSING_EXTRA) from None
    return dashboard, uvicorn


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, made before the database is opened: a port already taken
    (or an address not this machine's) is a usage error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    except (UnicodeError, ValueError) as e:  # a host no address can be made of
        sock.close()
        raise UsageError(f"--host cannot be listened on: {host!r} ({e})") from None
    return sock
