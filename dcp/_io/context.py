"""One zmq context per process, re-created after a fork."""

from __future__ import annotations

import os
import threading

import zmq

__all__ = ["get_context"]

_lock = threading.Lock()
_context: zmq.Context[zmq.Socket[bytes]] | None = None
_pid = -1


def get_context() -> zmq.Context[zmq.Socket[bytes]]:
    """The process's shared zmq context; a new one if the process id changed.

    A forked child (e.g. a Spark Python worker) must not use its parent's context.
    """
    global _context, _pid
    pid = os.getpid()
    if _context is None or _pid != pid:
        with _lock:
            if _context is None or _pid != pid:
                _context = zmq.Context()
                _pid = pid
    return _context
