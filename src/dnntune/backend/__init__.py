"""The engine contract and everything the providers and the facade share about running a plan.

``handle`` (device, stream, timer), ``knobs``, ``engine`` (the Engine + Plan contract),
``registry`` (built-in providers and entry points), ``heuristics`` (the policy chain),
``plans`` (the execution-plan path), ``variant_pack`` (with its overlap check,
``pack_aliasing``), ``timer`` and ``cache_flush``.
Nothing here imports ``overrides/``: the Config policy plugs into the chain from above.
"""
