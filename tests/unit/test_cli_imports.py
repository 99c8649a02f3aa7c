"""``--help`` and ``--version`` must stay cheap: the CLI's own modules load no SQLAlchemy
or Alembic for them.

The package root ``durablesched/__init__.py`` still imports the stores, so the
probe loads the CLI under a bare ``durablesched`` package; what it shows is
that only the root is left to make lazy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import durablesched

PROBE = """
import contextlib, io, json, sys, types

package = types.ModuleType("durablesched")
package.__path__ = [sys.argv[1]]
sys.modules["durablesched"] = package

from durablesched.cli.main import main
from durablesched.cli.parser import build_parser

for argv in (["--help"], ["--version"], *([name, "--help"] for name in build_parser().commands)):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def test_help_of_every_command_and_version_import_neither_sqlalchemy_nor_alembic() -> None:
    package = Path(durablesched.__file__).parent
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(package)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "durablesched" in loaded
    assert not loaded & {"sqlalchemy", "alembic"}
