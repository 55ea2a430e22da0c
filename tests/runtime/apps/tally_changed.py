"""``tests.runtime.apps.tally`` with a planted change: ``bump`` on ``c-3`` answers otherwise."""

from __future__ import annotations

from tests.runtime.apps.tally import build

PLANTED = "c-3"
app = build({PLANTED})
