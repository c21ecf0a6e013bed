"""Who runs what, and when: where a node runs (placement.py), the per-loop runner and its
order of calls (loop.py, task_order.py), kernels on worker threads (offload.py), drivers'
wake-ups, and the blocking driver (blocking.py)."""
