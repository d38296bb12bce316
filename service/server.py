"""One server process: uvicorn around the app, with the drain at shutdown that
docs/deployment.md promises ("Graceful shutdown"; see DrainingServer). `python -m service`
runs one; `--workers N` runs N (service.workers), each calling `serve` on the connections the
parent deals it (`Inbox`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.app import create_app
from service.malloc import keep_large_blocks_mapped
from service.registry import LoadFlags, Registry
from service.settings import Settings

SETTLE_SECONDS = 0.1  # at shutdown, for requests on connections already accepted to arrive


class Inbox:
    """A worker's connections, dealt by the parent (service.dealer.Dealer) over a Unix
    socket pair: each message carries one accepted socket. `on_close` is called as each
    connection closes, so that the parent deals the next to the least busy worker. Closing
    the inbox tells the parent this worker takes no more; the parent's end closing (it died)
    stops the worker as SIGTERM does."""

    def __init__(self, channel: socket.socket, on_close: Callable[[], None]) -> None:
        self.channel, self.on_close = channel, on_close
        self._server: uvicorn.Server | None = None
        self._protocol: type[asyncio.Protocol] | None = None
        self._connecting: set[asyncio.Task] = set()  # referenced until done

    def open(self, server: uvicorn.Server) -> None:
        """Start serving what arrives, with `server`'s HTTP protocol (as uvicorn builds it for
        a connection of its own listening socket)."""
        base, on_close = server.config.http_protocol_class, self.on_close

        class Counted(base):  # type: ignore[valid-type, misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                on_close()

        self._server, self._protocol = server, Counted
        self.channel.setblocking(False)
        asyncio.get_running_loop().add_reader(self.channel.fileno(), self._receive)

    def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.channel, 16, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # the parent is gone: no more connections, drain
                self.close()
                if self._server is not None:
                    self._server.handle_exit(signal.SIGTERM, None)
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                task = loop.create_task(loop.connect_accepted_socket(self._make_protocol, conn))
                self._connecting.add(task)
                task.add_done_callback(self._connecting.discard)

    def _make_protocol(self) -> asyncio.Protocol:
        server = self._server
        assert server is not None and self._protocol is not None
        return self._protocol(  # type: ignore[call-arg]
            config=server.config, server_state=server.server_state, app_state=server.lifespan.state
        )

    def close(self) -> None:
        if self.channel.fileno() != -1:
            asyncio.get_running_loop().remove_reader(self.channel.fileno())
            self.channel.close()


class Shed:
    """The connections a worker gives up when the parent asks (service.workers: a replacement
    has loaded and this worker holds more than its share): the next `asked - done` responses
    say `Connection: close`, so their clients reconnect, and the parent deals those
    connections to the least busy worker. Closing after a response, never an idle
    connection, leaves no request on its way to a closed socket. `asked` is written by the
    parent, `done` by this worker alone (shared arrays, one slot per worker)."""

    def __init__(self, asked: Any, done: Any, index: int) -> None:
        self.asked, self.done, self.index = asked, done, index

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def shedding(scope: Scope, receive: Receive, send: Send) -> None:
            i = self.index
            if scope["type"] != "http" or self.done[i] >= self.asked[i]:
                return await app(scope, receive, send)
            self.done[i] += 1

            async def closing(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [*message.get("headers", []), (b"connection", b"close")]
                    message = {**message, "headers": headers}
                await send(message)

            await app(scope, receive, closing)

        return shedding


@dataclass(frozen=True)
class WorkerLink:
    """What a worker of several shares with its parent (service.workers): the connections it
    is dealt, the load flags /ready reads, the parent's restart counts /metrics shows, and the
    connections it is asked to give up."""

    inbox: Inbox
    load_flags: LoadFlags
    restarts: Sequence[int]
    shed: Shed


class DrainingServer(uvicorn.Server):
    """Drains on SIGTERM / SIGINT (Ctrl-C) and then exits 0, a clean stop:

    1. the signal turns /ready to 503 `draining` at once, and new inference requests to 503
       `not_ready` with Retry-After, on new connections as on open ones;
    2. the listening socket stays open while requests are in flight (up to drain_timeout), so a
       client that still connects is told to go elsewhere instead of refused by the kernel;
    3. once none is in flight, the socket closes (from then on, connections are refused) and
       the requests already on accepted connections are answered before those close.

    A second Ctrl-C skips the drain, as uvicorn's does."""

    def __init__(
        self,
        config: uvicorn.Config,
        registry: Registry,
        drain_timeout: float,
        inbox: Inbox | None = None,
    ) -> None:
        super().__init__(config)
        self.registry = registry
        self.drain_timeout = drain_timeout
        self.inbox = inbox

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # A worker of several listens on nothing: its connections come through its inbox.
        await super().startup([] if self.inbox is not None else sockets)
        if self.inbox is not None and self.started:
            self.inbox.open(self)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.inbox is not None and sig == signal.SIGINT:
            # a worker of several: Ctrl-C reached the whole group and the parent sends SIGTERM;
            # taken as a second signal, it would skip the drain when it comes after that one
            return
        # uvicorn's own handler also records the signal and raises it again once the server has
        # stopped, so the process ends killed by it (143): a drained stop is a success here
        if sig in (signal.SIGINT, signal.SIGTERM):
            self.registry.draining = True
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.force_exit:
            await self.registry.admission.wait_idle(self.drain_timeout)
        # uvicorn closes every connection without a request in progress at once, also one whose
        # request is already on its way (accepted, not yet parsed): that request would be lost.
        # Stop accepting first and give those a moment to arrive; they are answered (503 while
        # draining) like any other.
        for server in self.servers:
            server.close()
        if self.inbox is not None:
            self.inbox.close()
        await asyncio.sleep(SETTLE_SECONDS)
        await super().shutdown(sockets)


def serve(settings: Settings, worker: WorkerLink | None = None) -> None:
    """One server process: on settings.host:port, or, as a worker of several, on the
    connections its parent deals it."""
    keep_large_blocks_mapped()  # reloads give their memory back (service/malloc.py)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    app = create_app(settings)
    served: ASGIApp = app
    if worker is not None:
        app.state.registry.load_flags = worker.load_flags
        app.state.metrics.worker_restarts = worker.restarts
        served = worker.shed.wrap(app)
    config = uvicorn.Config(
        served,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout),
    )
    inbox = worker.inbox if worker is not None else None
    DrainingServer(config, app.state.registry, settings.drain_timeout, inbox).run()
