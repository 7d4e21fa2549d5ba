"""Shards: a supervisor, W worker processes on one port, one owner per resource type."""
