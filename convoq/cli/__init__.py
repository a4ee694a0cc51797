"""The ``convoq`` command line and its demo, on top of the library.

- :mod:`convoq.cli.app`: the commands (typer); they parse, call the library and print.
- :mod:`convoq.cli._render`: how turns, events, history and errors are printed.
- :mod:`convoq.cli._asks`: ``--model-setting`` / ``--output-schema`` options checked.
- :mod:`convoq.cli._usage`: usage errors as one line (exit code 2), help as plain text.
- :mod:`convoq.cli._transfer`: ``convoq export`` / ``convoq import``.
- :mod:`convoq.cli.demo`: ``convoq demo``, the whole stack on the embedded Redis, with
  :mod:`convoq.cli.demo_agents` (its agent profiles) and :mod:`convoq.cli._demo_gateway`.
"""

from convoq.cli.app import app, main

__all__ = ["app", "main"]
