"""``python -m dnntune`` runs the CLI (torchrun launches it this way: ``torchrun -m dnntune``).

The console script's entry point, whose Ctrl-C guard covers the CLI's imports too (Python has
imported the ``dnntune`` package itself before this module runs).
"""

from _dnntune_cli import main

if __name__ == "__main__":
    main()
