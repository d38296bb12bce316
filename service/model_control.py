"""Model control while serving, in Triton's modes (`--model-control`):

- `none`: the packages found at start are the ones served until the process ends;
- `poll`: model_dir is looked at every `poll_interval` seconds: a new package folder is loaded,
  a removed one unloaded, a changed one reloaded (Registry.load: the new version opens and
  warms up beside the old, then takes the new requests; nothing in flight is dropped);
- `explicit`: `POST /models/{name}/load` and `POST /models/{name}/unload`, with the admin key.

A folder is changed when its fingerprint changes: the sha256 of package.json (which holds the
sha256 of every file) and each file's size and modification time. A half-copied folder is never
loaded, twice over: poll mode loads a folder only once its fingerprint has stayed the same for a
whole poll interval (a copy in progress keeps changing it), and then every file is checked
against package.json's hashes (verify_sha256, which poll mode requires): a file still being
written fails that check, and the version serving stays. Copying into a temporary name and
renaming it into model_dir is the way that needs neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from heads.adapters import ENCODER
from service.registry import Registry, fingerprint, is_encoder

log = logging.getLogger(__name__)


class Poller:
    """Poll mode: keep the registry in step with model_dir."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.interval = registry.settings.poll_interval
        self._seen: dict[str, str | None] = {}  # name -> fingerprint at the last look
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="model-poll")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        await self.registry.loaded.wait()
        while not self.registry.draining:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except Exception:  # a bug here must not end polling
                log.exception("model poll failed")

    async def poll(self) -> None:
        """One look at model_dir: load what is new or changed and has stayed so for one
        interval, unload what is gone."""
        registry = self.registry
        # encoders load before the adapters that run over them, and unload after them
        packages = sorted(registry.packages(), key=lambda found: not is_encoder(found[0]))
        found = dict((name, path) for path, name in packages)
        seen, self._seen = self._seen, {n: fingerprint(p) for n, p in found.items()}
        for name, path in found.items():
            now = self._seen[name]
            entry = registry.entry(name)
            if now is None or now != seen.get(name, now if entry else None):
                continue  # unreadable, or changed since the last look: not settled yet
            if entry is not None and entry.attempted == now:
                continue  # this very folder was tried already (served, or failed)
            # a failure is logged and shown by the registry; the old version, if any, serves
            with contextlib.suppress(Exception):
                await registry.load(path, name, attempt=now)
        gone = [e for e in registry.entries if e.name not in found]
        for entry in sorted(gone, key=lambda e: e.task == ENCODER):
            await registry.unload(entry.name)
