"""Importing this module leaves a mark: the test proves no worker ever imports it."""

import os
from pathlib import Path

Path(os.environ.get("DS_TEST_DIR", "."), "evil-imported").touch()
