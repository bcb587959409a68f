"""``python -m dnntune`` runs the CLI (torchrun launches it this way: ``torchrun -m dnntune``)."""

from dnntune.cli.app import main

if __name__ == "__main__":
    main()
