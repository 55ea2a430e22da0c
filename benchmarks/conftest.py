"""Shared pytest set-up for ``python -m pytest benchmarks`` (not part of the CI suite in ``tests/``)."""

from __future__ import annotations

import os
import sys

# `python -m pytest benchmarks` from the repository root already finds the packages; this
# makes `pytest benchmarks/...` from elsewhere work too.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
