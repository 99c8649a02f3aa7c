"""Integrations with frameworks: optional, each needing its extra, never imported by the core."""
