"""asyncgrad's benchmarks: asyncgrad beside PyTorch, HIPS autograd and a hand-written numpy
backward (the floor), measured in the same process.

Run ``python -m bench`` from the repository root (see ``docs/benchmarks.md``).
"""
