"""The durable backends on SQL: the dialect-neutral store, and one module per database."""
