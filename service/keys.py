"""The inference API keys: several at once, so that a key is rotated without a window where
old clients fail (add the new key, move the clients, remove the old one).

Keys come from `api_key` (one key, or several separated by commas) and from `api_keys_file`
(one key per line; blank lines and lines starting with # ignored), which is read again when
its modification time or size changes, looked at no more than once every RELOAD_SECONDS: a
key removed from the file is refused within that time, a key added accepted. A file that
cannot be read keeps the keys last read (and logs why), rather than opening the service or
refusing everyone. Every key is compared in constant time, and all of them on every check, so
the time taken says neither which key nor how much of one was right.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from pathlib import Path

from pydantic import SecretStr

log = logging.getLogger(__name__)
RELOAD_SECONDS = 1.0


def parse_keys(text: str, sep: str | None = None) -> set[bytes]:
    """The keys in `text`: split on `sep` (None: lines, # comments), stripped, empty dropped."""
    parts = text.split(sep) if sep else [line.partition("#")[0] for line in text.splitlines()]
    return {p.strip().encode() for p in parts if p.strip()}


class Keys:
    """The inference keys in force; `accepts(token)` is the check. No keys at all: open."""

    def __init__(self, api_key: SecretStr | None, api_keys_file: Path | None) -> None:
        self.fixed = parse_keys(api_key.get_secret_value(), ",") if api_key else set()
        self.file = api_keys_file
        self.from_file: set[bytes] = set()
        self._seen: tuple[int, int] | None = None  # the file's (mtime_ns, size) last read
        self._checked = float("-inf")
        if self.file is not None:
            self._reload(time.monotonic())
            if self._seen is None:
                raise ValueError(f"api_keys_file {self.file}: cannot be read")

    @property
    def enabled(self) -> bool:
        return self.file is not None or bool(self.fixed)

    def accepts(self, token: bytes) -> bool:
        now = time.monotonic()
        if self.file is not None and now - self._checked >= RELOAD_SECONDS:
            self._reload(now)
        ok = False
        for key in self.fixed | self.from_file:
            ok |= hmac.compare_digest(token, key)  # no early exit: every key is compared
        return ok

    def _reload(self, now: float) -> None:
        assert self.file is not None
        self._checked = now
        try:
            st = os.stat(self.file)
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return
            keys = parse_keys(self.file.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            log.error("api_keys_file %s: %s; keeping the keys last read", self.file, exc)
            return
        self._seen, self.from_file = (st.st_mtime_ns, st.st_size), keys
        log.info("api_keys_file %s: %d key(s)", self.file, len(keys))
