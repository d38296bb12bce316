"""The parent's side of `--workers N` for connections: it alone listens on the port and deals
each accepted connection to a worker (service.workers starts and replaces the workers).

The accepted socket travels over a Unix socket pair per worker (SCM_RIGHTS); the worker
serves it with service.server's `Inbox` and counts each close in a shared array, so that the
parent knows how many each holds. Because the parent keeps the listening socket, the port
stays open while a worker dies and its replacement starts.
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Sequence
from typing import Any

POLL_SECONDS = 0.2


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # uvicorn's default backlog
    return sock


class Dealer:
    """Accept on the port and hand each connection to the worker with the fewest open (dealt
    minus closed; the worker counts its closes in `closed`), the lowest index on a tie. The
    kernel's own spreading (a socket per worker with SO_REUSEPORT) hashes each connection: 8
    keep-alive clients on 2 workers split 6/2 or worse 29% of the time, and one listening
    socket shared by all let the first worker to wake accept a whole burst (3 trials in 6 left
    a worker with none; issue 31).

    Which workers get connections:
    - one that no longer takes them (draining, dead, its channel closed) never;
    - once the service has started (`started`: every worker has loaded its packages once), only
      workers that have loaded (`loaded[i]`): a replacement still opening its sessions gets
      none, and while no worker serves, connections wait in the kernel's backlog instead of
      being refused or answered 503;
    - before that, any that takes them (it answers /ready with 503 `loading`);
    - after `stopping` is set, any that takes them (it answers 503 `draining`); once none
      does, the port is closed."""

    def __init__(
        self,
        listener: socket.socket,
        channels: Sequence[socket.socket | None],
        closed: Any,
        loaded: Any = None,
        started: Any = None,
    ) -> None:
        self.listener, self.closed = listener, closed
        self.channels: list[socket.socket | None] = list(channels)
        self.loaded = loaded if loaded is not None else [1] * len(self.channels)
        self.started = started  # a shared Value, set by the workers; None: always started
        listener.setblocking(False)  # another wake-up may have taken the connection
        self.dealt = [0] * len(self.channels)
        self.taking = [c is not None for c in self.channels]
        self.stopping = False
        self._lock = threading.Lock()  # deal (this thread) against replace / retire (parent's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dealer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def replace(self, i: int, channel: socket.socket) -> None:
        """Worker `i` is a new process reached through `channel`; it holds no connection."""
        with self._lock:
            old, self.channels[i], self.taking[i] = self.channels[i], channel, True
            self.dealt[i] = self.closed[i] = 0
        if old is not None:
            old.close()

    def retire(self, i: int) -> None:
        """Worker `i` is gone: deal it nothing more, close the parent's end of its channel."""
        with self._lock:
            channel, self.channels[i], self.taking[i] = self.channels[i], None, False
        if channel is not None:
            channel.close()

    def eligible(self) -> list[int]:
        """The workers a new connection may go to now."""
        started = (self.started is None or self.started.value) and not self.stopping
        return [i for i, t in enumerate(self.taking) if t and (self.loaded[i] or not started)]

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not self.eligible():
                    if self.stopping:  # refused from now on, rather than accepted and dropped
                        self.listener.close()
                        return
                    self._stop.wait(POLL_SECONDS)  # no worker serves: leave them queued
                    continue
                if not sel.select(POLL_SECONDS):
                    continue
                try:
                    conn, _ = self.listener.accept()
                except OSError:  # BlockingIOError: another wake-up took it
                    continue
                with conn:  # the worker holds its own copy once sent
                    self.deal(conn)

    def deal(self, conn: socket.socket) -> int | None:
        """The worker `conn` went to, or None when no worker takes connections."""
        with self._lock:
            load = {i: self.dealt[i] - self.closed[i] for i in self.eligible()}
            for i in sorted(load, key=load.__getitem__):
                channel = self.channels[i]
                assert channel is not None
                try:
                    socket.send_fds(channel, [b"c"], [conn.fileno()])
                except OSError:  # the worker closed its end: it takes no more
                    self.taking[i] = False
                    continue
                self.dealt[i] += 1
                return i
        return None
