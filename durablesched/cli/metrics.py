"""``durablesched metrics``: the Prometheus metrics of a database, printed or served."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, UsageError
from durablesched.cli.options import Commands, option
from durablesched.cli.values import positive_int
from durablesched.errors import ConfigurationError

if TYPE_CHECKING:
    from types import ModuleType

#: Where ``--serve PORT`` listens unless given ``HOST:PORT``: this host only.
SERVE_HOST = "127.0.0.1"


def register(commands: Commands) -> None:
    p = commands.add(
        "metrics", cmd_metrics, "print the Prometheus metrics of the database (or serve them)"
    )
    option(
        p,
        "--serve",
        help=f"serve them over HTTP at [HOST:]PORT (host {SERVE_HOST} unless given) until stopped",
    )


def cmd_metrics(args: argparse.Namespace) -> int:
    address = None if args.serve is None else _address(args.serve)
    metrics = _metrics_module()
    store = open_db(args, readonly=True)
    try:
        if address is None:
            sys.stdout.buffer.write(metrics.metrics_text(store))
            sys.stdout.flush()
            return EXIT_OK
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics.StoreCollector(store))
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _signum, _frame: stop.set())
        try:
            server, _thread = start_http_server(address[1], addr=address[0], registry=registry)
        except OSError as e:
            raise UsageError(f"--serve: cannot listen on {args.serve}: {e.strerror}") from None
        print(f"serving metrics at http://{address[0]}:{server.server_port}/metrics", flush=True)
        stop.wait()
        server.shutdown()
        server.server_close()
        return EXIT_OK
    finally:
        store.close()


def _address(value: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT``, checked."""
    host, _, port = value.rpartition(":")
    return host or SERVE_HOST, positive_int("--serve's port", port, maximum=65535)


def _metrics_module() -> ModuleType:
    """durablesched.metrics, or exit 2 naming the extra to install."""
    try:
        import durablesched.metrics as metrics  # noqa: PLR0402 - the module, not the facade
    except ConfigurationError as e:
        raise UsageError(str(e)) from None
    return metrics
