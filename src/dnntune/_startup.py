"""The package's first import: ``python -m dnntune`` guards its own startup from here.

Python imports this package (torch: seconds) before it runs ``dnntune/__main__.py``, whose
Ctrl-C guard (``_dnntune_cli.main``) could only start once that was done: a Ctrl-C meanwhile
printed a page of KeyboardInterrupt traceback (and exited by the signal, not with 130). Only
that command is guarded; a program that imports ``dnntune`` keeps Python's handlers.
"""

from __future__ import annotations

import sys

if sys.argv[:1] == ["-m"]:  # Python is still looking for the module `-m` names
    from _dnntune_cli import guard_package_import

    guard_package_import()
