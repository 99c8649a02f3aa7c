"""No models: the queue's tables are durablesched's own (docs/sql.md). This module exists
so that Django sends this app ``post_migrate`` (apps.py), which it does only for apps
with a models module."""
