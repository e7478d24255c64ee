"""SIGTERM and SIGINT as a graceful stop, for the commands that run until stopped."""

from __future__ import annotations

from collections.abc import Callable

from jobguard.process import on_stop_signals


def stop_on_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop()`` on SIGTERM or SIGINT from now on; return what restores the old handlers.

    Installed before a command starts serving, so a signal that comes while it sets up stops it
    gracefully instead of killing it. Off the main thread (signals cannot be handled there) it
    does nothing.
    """
    return on_stop_signals(lambda signum: stop())
