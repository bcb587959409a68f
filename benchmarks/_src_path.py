"""Which dnntune a benchmark script imports when run from a checkout: the checkout's own
``src/``, unless ``PYTHONPATH`` names a folder that holds a ``dnntune`` package, which then wins.

``benchmarks/ab_trees.sh`` runs one copy of these scripts over two source trees, each given
on ``PYTHONPATH``. Before session 47 the scripts put their checkout's ``src/`` ahead of it,
so both halves of every A/B ran the scripts' own tree (session 46's A/Bs compared a tree with
itself); ``dnntune_path`` in ``models.json`` now says which package ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def given_on_pythonpath() -> str | None:
    """The first ``PYTHONPATH`` folder that holds a ``dnntune`` package, or None."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "dnntune" / "__init__.py").is_file():
            return entry
    return None


def use_checkout_src(script: str) -> None:
    """Put the checkout's ``src/`` (beside the folder of ``script``) first on ``sys.path``,
    unless ``PYTHONPATH`` gives a dnntune of its own."""
    if given_on_pythonpath() is None:
        sys.path.insert(0, str(Path(script).resolve().parent.parent / "src"))
