"""``durablesched dashboard``: safe by default, one line for what it refuses, the extra
imported by this command only, and a real server that answers and stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from durablesched import SQLiteStore
from durablesched.cli.dashboard import MISSING_EXTRA, loopback, read_token, weak
from durablesched.cli.main import main
from durablesched.cli.parser import build_parser

from ..conftest import WAIT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_only_this_host_is_served_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "d.db")
    for host in ("0.0.0.0", "192.0.2.1", "::", "example.com"):  # noqa: S104 - refused
        assert main(["dashboard", "--db", db, "--host", host]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "give --token" in err
    assert main(["dashboard", "--db", db, "--token", " "]) == 2
    assert "--token must not be empty" in capsys.readouterr().err
    assert not (tmp_path / "d.db").exists()  # refused before opening anything
    assert all(map(loopback, ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost")))


def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["dashboard", "--db", str(tmp_path / "d.db")]) == 2
    assert capsys.readouterr().err == f"durablesched: error: {MISSING_EXTRA}\n"


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--db", str(tmp_path / "d.db"), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


PROBE = """
import json, sys
import durablesched
from durablesched.cli.main import main
from durablesched.cli.parser import build_parser
for argv in (["--help"], ["ls", "--help"], ["metrics", "--help"], ["dashboard", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print(json.dumps(sorted({m.partition(".")[0] for m in sys.modules})))
"""


def test_nothing_of_the_dashboard_is_imported_but_by_its_command() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert not loaded & {"starlette", "jinja2", "uvicorn", "python_multipart"}
    assert "durablesched.dashboard" not in result.stdout


DASHBOARD = [sys.executable, "-m", "durablesched", "dashboard"]


def test_the_command_serves_the_dashboard_until_stopped(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    SQLiteStore(db).close()  # --read-only opens an existing database only
    port = free_port()
    env = {**os.environ, "DURABLESCHED_DB": str(db), "DURABLESCHED_DASHBOARD_PORT": str(port)}
    server = subprocess.Popen(
        [*DASHBOARD, "--read-only", "--allowed-host", "queue.internal"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # printed once it listens: no wait needed after it
        assert line == f"serving the dashboard at http://127.0.0.1:{port}/ (Ctrl-C stops it)\n"
        url = f"http://127.0.0.1:{port}/"
        with urllib.request.urlopen(url, timeout=WAIT) as answer:
            body = answer.read().decode()
        assert "Overview" in body and "read-only" in body
        for host, status in (("queue.internal", 200), ("rebind.evil.example", 400)):
            asked = urllib.request.Request(url, headers={"Host": f"{host}:{port}"})
            try:
                with urllib.request.urlopen(asked, timeout=WAIT) as answer:  # noqa: S310 - http
                    assert answer.status == status, host
            except urllib.error.HTTPError as e:
                assert e.code == status, host
    finally:
        server.send_signal(signal.SIGTERM)
        _out, err = server.communicate(timeout=WAIT)  # closes the pipes too
    assert server.returncode == 0, err


def test_a_weak_token_is_refused_beyond_this_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "d.db")
    for token, why in (
        ("x", "1 characters, fewer than 16"),
        ("short-token", "fewer than 16"),
        ("abababababababababab", "only 2 different characters"),
    ):
        assert main(["dashboard", "--db", db, "--host", "0.0.0.0", "--token", token]) == 2  # noqa: S104
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the token is too weak for --host 0.0.0.0" in err, err
        assert why in err and "secrets.token_urlsafe()" in err
    assert not (tmp_path / "d.db").exists()
    assert weak("x") is not None and weak("s3cret-token-of-the-tests") is None


def test_the_token_from_a_file_or_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "d.db")
    (tmp_path / "token").write_text("  correct-horse-battery-staple\nsecond line\n")
    (tmp_path / "empty").write_text("\n")
    base = ["dashboard", "--db", db]
    args = build_parser().parse_args([*base, "--token-file", str(tmp_path / "token")])
    assert read_token(args) == "correct-horse-battery-staple"
    for extra, message in (
        (["--token-file", str(tmp_path / "nosuch")], "cannot be read: No such file"),
        (["--token-file", str(tmp_path / "empty")], "holds no token"),
        (["--token", "t", "--token-file", str(tmp_path / "token")], "give the token once"),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    monkeypatch.setenv("DURABLESCHED_DASHBOARD_TOKEN", "from-the-environment-1")
    assert read_token(build_parser().parse_args(base)) == "from-the-environment-1"
    monkeypatch.setenv("DURABLESCHED_DASHBOARD_TOKEN", "x")
    assert main([*base, "--host", "0.0.0.0"]) == 2  # noqa: S104 - refused: too weak
    assert "too weak" in capsys.readouterr().err


def test_a_mistyped_db_is_one_line_not_a_new_empty_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    typo = tmp_path / "tpyo.db"
    for extra in ([], ["--read-only"]):
        assert main(["dashboard", "--db", str(typo), "--port", str(free_port()), *extra]) == 2
        err = capsys.readouterr().err
        assert err == f"durablesched: error: no such database: {typo}\n", err
        assert not typo.exists()
    # A PostgreSQL database without the schema: refused too, and nothing created in it.
    assert main(["dashboard", "--db", pg_url, "--port", str(free_port())]) == 2
    assert "has no durablesched schema" in capsys.readouterr().err
