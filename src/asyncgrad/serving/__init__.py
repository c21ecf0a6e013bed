"""Serving gradients in batches: many concurrent requests, one pass per batch, each
request answered as if it had run its own backward (API.md §10)."""

from .batcher import GradientBatcher
from .requests import GradientResult
from .rules import register_per_sample_rule
from .statistics import BatcherStatistics

__all__ = ["BatcherStatistics", "GradientBatcher", "GradientResult", "register_per_sample_rule"]
