"""Aaren attention computed three ways with one signature, and the storable states.

``naive`` (the O(N^2) reference), ``scan`` (chunked or Hillis-Steele prefix scan), ``step`` (one
token); ``combine`` (the state ``(m, u, w)`` and its associative operator); ``state`` (the backbones'
typed, storable states).
"""

from aaren_core.attention.combine import ScanState, combine, empty_state
from aaren_core.attention.naive import attention_naive
from aaren_core.attention.scan import attention_scan, scan_chunked, scan_hillis_steele
from aaren_core.attention.step import attention_step

__all__ = [
    "ScanState",
    "attention_naive",
    "attention_scan",
    "attention_step",
    "combine",
    "empty_state",
    "scan_chunked",
    "scan_hillis_steele",
]
