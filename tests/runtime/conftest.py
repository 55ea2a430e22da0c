"""Runtime tests run the example apps on the in-memory engine unless told otherwise."""

from __future__ import annotations

import os

os.environ.setdefault("SFAAS_STORE", "memonly")
