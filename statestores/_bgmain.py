"""Entry point of a background worker process: ``python -m statestores._bgmain <parent pid>``.

A module of its own (not ``-m statestores.background``) so that the worker's ``__main__``
holds nothing a pickled task could name by mistake; see :mod:`statestores.background`
(the worker itself is :mod:`statestores.bgworker`).
"""

from __future__ import annotations

import sys

from statestores.bgworker import child_main

if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
