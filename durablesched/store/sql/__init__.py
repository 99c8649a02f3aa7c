"""The durable backends on SQL: a dialect-neutral store, and one module per database.

- ``store``: ``SQLStore``, the Store protocol on any SQLAlchemy engine
- ``sqlite``, ``postgres``: each database's own statements, dialect, engine,
  store and change watcher (``inotify``: SQLite's wake-up on file writes)
- ``statements``: the SQL both databases share; ``dialect``: what differs
- ``transactions``: write and read transactions, busy retries, the driver-level path
- ``submitting``, ``claiming``, ``outcomes``, ``group_commit``, ``reclaiming``: the
  writes a submitter and a worker make
- ``operator_actions`` (requeue, stats, purge), ``moving`` (to another database)
- ``codec`` (times, JSON, rows), ``translate`` (errors), ``urls`` (which database)
- ``schema`` (the tables), ``migrate`` (the Alembic migrations)
"""
