"""The ``durablesched`` command.

``main`` parses and runs; ``parser`` and ``options`` build the command line from
each command module (``schema``, ``worker``, ``tasks``, ``operate``); ``app``
loads the user's registry, ``database`` opens the store, ``values`` checks
option values, ``output`` prints, ``errors`` maps refusals to exit codes.
"""

from durablesched.cli.main import main as main

__all__ = ["main"]
