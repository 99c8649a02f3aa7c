"""What only the in-memory backend promises: a bounded heap under cancel churn."""

from __future__ import annotations

from datetime import timedelta

from durablesched import CancelOutcome, MemoryStore
from durablesched.records import NewTask

from ..conftest import T0


def test_compaction_keeps_the_heap_bounded_under_cancel_churn() -> None:
    store = MemoryStore(compact_ratio=0.5, compact_min=64)
    live = [s.task_id for s in store.submit([NewTask("keep", {}, T0, 1)] * 100, T0)]
    peak = 0
    for _ in range(50):
        batch = store.submit([NewTask("churn", {}, T0 + timedelta(hours=1), 1)] * 200, T0)
        for s in batch:
            assert store.request_cancel(s.task_id, T0) is CancelOutcome.CANCELLED
        peak = max(peak, store.heap_size)
    # 10,000 cancellations, yet the heap never held much more than twice the live tasks
    # plus one batch.
    assert store.compactions > 0
    assert peak <= 2 * (len(live) + 200) + 1
    assert store.stale_entries <= store.heap_size
    claims = store.claim("w", 1000, T0 + timedelta(hours=2), timedelta(seconds=30))
    assert sorted(c.task_id for c in claims) == live


def test_stale_entry_is_skipped_after_checking_the_registry() -> None:
    store = MemoryStore(compact_min=10_000)
    a, b = store.submit([NewTask("a", {}, T0, 1), NewTask("b", {}, T0, 1)], T0)
    store.request_cancel(a.task_id, T0)
    assert store.heap_size == 2 and store.stale_entries == 1
    (claim,) = store.claim("w", 5, T0, timedelta(seconds=30))
    assert claim.task_id == b.task_id
    assert store.heap_size == 0 and store.stale_entries == 0
