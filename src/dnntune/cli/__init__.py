"""The ``dnntune`` command line: one module per command, all thin (parse, call, exit code).

``app.py`` holds the typer app and ``main``; ``_graphs.py`` expands ``-g`` paths;
``_output.py`` owns the consoles and logging setup. Nothing in the library imports this package.
"""
