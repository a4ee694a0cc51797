"""The last bound of a warm shutdown: the process exits even when a thread cannot be stopped.

A turn's run is cancelled at shutdown once its grace ran out, but a blocking call running in
a worker thread (a sync model or tool, via ``asyncio.to_thread``) cannot be interrupted, and
the interpreter joins such threads at exit without a bound. The turn itself is safe (handed
back, its writes fenced); only the process would hang. So a warm shutdown arms a deadline
after which the process exits at once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger("convoq.worker")


def arm_exit_deadline(timeout_s: float) -> threading.Timer:
    """Exit the process (status 0) if it is still up ``timeout_s`` from now. Only for a
    worker process shutting down: never arm it in a process that has other work."""

    def exit_now() -> None:
        log.warning(
            "warm shutdown: still up %.0fs after it began (a thread that cannot be stopped"
            " is still running); exiting now, its turns were handed back",
            timeout_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(timeout_s, exit_now)
    timer.daemon = True
    timer.start()
    return timer
