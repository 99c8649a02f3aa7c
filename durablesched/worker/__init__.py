"""The worker: claims due tasks, runs them, and records their outcomes under their claims.

One module per job, composed by :class:`Worker`:

- ``loop``: :class:`Worker`, the public API and the claim loop;
- ``options``: the constructor's options, checked once;
- ``slots``: the attempts running here, and the one lock they share;
- ``attempt``: one attempt's run, where its task says, ending in an Outcome;
- ``environments``: an attempt in a child process;
- ``threads``: the task threads;
- ``commit``: the group commit of outcomes, and the claim into freed slots;
- ``ahead``: the claims held ahead of the slots, and the room each claim takes;
- ``committer``: the thread that leads the group commits of a worker claiming ahead;
- ``leases``: heartbeats, lease checks, the reclaim of expired leases;
- ``presence``: this worker's row in the workers table (registered, removed);
- ``trouble``: store errors: backoff, one log line per distinct error, giving up;
- ``watch``: what a commit by another process changes here.
"""

from durablesched.worker.loop import Worker as Worker

__all__ = ["Worker"]
