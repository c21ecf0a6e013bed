"""Threads and what they run on, knowing no graph: the engine's worker pool, thread and
ownership helpers, and the other processes' CPU load."""
