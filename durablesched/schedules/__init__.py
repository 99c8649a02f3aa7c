"""Schedules: periodic tasks that fire exactly once per fire time.

``timing`` is the time arithmetic (fire times, daylight saving, misfires), with
no I/O; ``declaration`` checks what a schedule is declared with. The store
keeps schedules and fires them (``Store.fire_schedules``); the worker's step is
``durablesched.worker.schedules``.
"""
