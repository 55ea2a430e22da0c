"""Entry point of a background worker process: ``python -m statestores._bgmain <parent pid>``.

A module of its own (not ``-m statestores.background``) so that the worker's ``__main__``
holds nothing a pickled task could name by mistake; see :mod:`statestores.background`.
"""

from __future__ import annotations

import sys

from statestores.background import _child_main

if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
