"""The worker: claims due tasks, runs them, and records their outcomes under their claims."""

from durablesched.worker.loop import Worker as Worker

__all__ = ["Worker"]
