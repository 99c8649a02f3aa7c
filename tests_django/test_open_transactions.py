"""On PostgreSQL, a request's ``atomic()`` block that enqueued holds up no other process's
enqueue (``ATOMIC_REQUESTS`` makes every view such a block): task ids come from a
sequence, where every submit used to take one counter row until its transaction ended."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist

from tests_django.conftest import ROOT, WAIT, worker_env
from tests_django.testapp.tasks import add

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

#: Another web process: enqueues twice on backend ``argv[1]``, and says the ids and how
#: long each enqueue took (the first also opens its store).
ENQUEUE = """
import json, sys, time
import django
django.setup()
from tests_django.testapp.tasks import add
took, ids = [], []
for i in range(2):
    started = time.monotonic()
    ids.append(add.using(backend=sys.argv[1]).enqueue(i, 40).id)
    took.append(time.monotonic() - started)
print(json.dumps({"ids": ids, "took": took}))
"""


@pytest.mark.parametrize("alias", ["pg"], indirect=True)
def test_an_enqueue_in_an_open_atomic_block_holds_up_no_other_process(alias: str) -> None:
    backend = task_backends[alias]
    with transaction.atomic(using=alias):
        mine = add.using(backend=alias).enqueue(1, 1)
        # The block stays open until the other process has finished (bounded: a process
        # held up by it would never finish, and the wait gives up).
        done = subprocess.run(
            [sys.executable, "-c", ENQUEUE, alias],
            env=worker_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WAIT / 2,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        theirs = json.loads(done.stdout)
        assert theirs["took"][1] < 1.0, theirs
        # Theirs are committed and visible; ours is not, until the block ends.
        for result_id in theirs["ids"]:
            assert backend.get_result(result_id).status is TaskResultStatus.READY
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(mine.id)
    assert backend.get_result(mine.id).args == [1, 1]
