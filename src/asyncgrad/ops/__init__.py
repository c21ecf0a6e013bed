"""Differentiable primitives as data: forward kernels and derivative rules by family."""
