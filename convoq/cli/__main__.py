"""``python -m convoq.cli``: the ``convoq`` command."""

from convoq.cli.app import main

main()
