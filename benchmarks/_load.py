"""The load generator: `concurrency` asyncio clients, each posting one request after another
over its own keep-alive HTTP/1.1 connection (a closed loop, like that many users who wait for
their answer), for a warm-up then a measured window of fixed length; bounded in time and count.

The client speaks just enough HTTP/1.1 over asyncio streams (request line, Content-Length
body; responses with Content-Length) to cost about 0.1 ms of CPU per request. httpx costs
1.5 ms per request at 1 connection and 3.5 ms at 32 (measured against the service on this
2-core machine): the load generator would take more CPU than the int8 model it measures, from
the same two cores. `client="httpx"` keeps httpx for comparison.

Only requests that start inside the measured window count towards latency; throughput is the
answers that arrive inside it. The client's own CPU time is reported too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

TIMEOUT = 60.0  # seconds one request may take before it counts as an error


@dataclass
class Level:
    """What one concurrency level measured."""

    concurrency: int
    seconds: float
    requests: int  # answered with 200 inside the window
    rows: int  # model rows (sequences) of those requests
    tokens: int  # real (unpadded) tokens of those rows
    errors: dict[str, int]  # status (or exception name) -> count, inside the window
    latency_ms: dict[str, float]  # p50 / p95 / p99 / mean / max of requests started in the window
    client_cpu: float  # cores the load generator used on average

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "seconds": round(self.seconds, 2),
            "requests": self.requests,
            "requests_per_s": round(self.requests / self.seconds, 2),
            "sequences_per_s": round(self.rows / self.seconds, 2),
            "tokens_per_s": round(self.tokens / self.seconds, 1),
            "latency_ms": self.latency_ms,
            "errors": self.errors,
            "client_cpu_cores": round(self.client_cpu, 3),
        }


def percentiles(values_ms: list[float]) -> dict[str, float]:
    if not values_ms:
        return {}
    a = np.asarray(values_ms)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(a.mean()), 3),
        "max": round(float(a.max()), 3),
    }


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the status and body."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (
            f"POST {parts.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            "content-type: application/json\r\ncontent-length: "
        ).encode()
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(TIMEOUT):
                return await self._post(body)
        except BaseException:
            await self.close()  # a half-read response leaves the stream unusable
            raise

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        if "content-length" not in headers:
            raise ConnectionError(f"response without content-length: {lines[0]}")
        payload = await reader.readexactly(int(headers["content-length"]))
        if headers.get("connection") == "close":
            await self.close()
        return status, payload

    async def close(self) -> None:
        if self.streams is not None:
            writer = self.streams[1]
            self.streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _drive(
    url: str,
    bodies: list[bytes],
    rows: list[int],
    tokens: list[int],
    concurrency: int,
    warmup: float,
    duration: float,
    max_requests: int,
    client: str,
) -> Level:
    next_item = itertools.count()
    latencies: list[float] = []
    errors: dict[str, int] = {}
    done = {"requests": 0, "rows": 0, "tokens": 0}
    start = time.perf_counter()
    window_start, window_end = start + warmup, start + warmup + duration

    async def worker(post: Any) -> None:
        while (t0 := time.perf_counter()) < window_end:
            k = next(next_item)
            if k >= max_requests:
                return
            i = k % len(bodies)
            try:
                status, payload = await post(bodies[i])
                outcome = str(status)
                if status == 200 and k < concurrency:  # the first answers: real JSON?
                    json.loads(payload)
            except (
                OSError,
                ValueError,
                TimeoutError,
                asyncio.IncompleteReadError,
                httpx.HTTPError,
            ) as e:
                outcome = type(e).__name__
            t1 = time.perf_counter()
            if not window_start <= t1 <= window_end:
                continue
            if outcome == "200":
                done["requests"] += 1
                done["rows"] += rows[i]
                done["tokens"] += tokens[i]
                if t0 >= window_start:
                    latencies.append((t1 - t0) * 1000)
            else:
                errors[outcome] = errors.get(outcome, 0) + 1

    cpu0 = time.process_time()
    if client == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(limits=limits, timeout=TIMEOUT) as http:

            async def post_httpx(body: bytes) -> tuple[int, bytes]:
                response = await http.post(url, content=body, headers=headers)
                return response.status_code, response.content

            await asyncio.gather(*(worker(post_httpx) for _ in range(concurrency)))
    else:
        # several URLs (replicas): connections dealt round-robin, as a balancer would
        urls = url.split()
        connections = [Connection(urls[i % len(urls)]) for i in range(concurrency)]
        await asyncio.gather(*(worker(c.post) for c in connections))
        for c in connections:
            await c.close()
    cpu = time.process_time() - cpu0
    elapsed = time.perf_counter() - start
    return Level(
        concurrency=concurrency,
        seconds=min(duration, max(time.perf_counter() - window_start, 1e-9)),
        requests=done["requests"],
        rows=done["rows"],
        tokens=done["tokens"],
        errors=errors,
        latency_ms=percentiles(latencies),
        client_cpu=cpu / elapsed,
    )


def run_level(
    url: str,
    bodies: list[dict[str, Any]],
    rows: list[int],
    tokens: list[int],
    concurrency: int,
    *,
    warmup: float = 2.0,
    duration: float = 10.0,
    max_requests: int = 500_000,
    client: str = "streams",
) -> Level:
    """Drive `url` with `concurrency` closed-loop clients; bodies are cycled in order, each
    client starting where the shared counter stands. Several URLs separated by spaces (one
    per replica) share the clients round-robin (streams client only)."""
    encoded = [json.dumps(b).encode() for b in bodies]
    return asyncio.run(
        _drive(url, encoded, rows, tokens, concurrency, warmup, duration, max_requests, client)
    )
