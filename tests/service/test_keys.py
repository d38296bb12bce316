"""Several inference keys at once, from settings and from a file read again when it changes:
a key is rotated without a restart and without a window where old clients fail."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from service import keys
from service.keys import Keys, parse_keys
from service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_each_of_several_keys_is_accepted(model_dir: Path) -> None:
    async with serve(Settings(model_dir=model_dir, api_key=" old-key , new-key ")) as s:
        for key, status in (("old-key", 200), ("new-key", 200), ("old-key,new-key", 401)):
            r = await s.client.post("/embed", json={"inputs": "a"}, headers=bearer(key))
            assert r.status_code == status, key
        assert (await s.client.post("/embed", json={"inputs": "a"})).status_code == 401


async def test_a_keys_file_rotates_keys_without_a_restart(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys, "RELOAD_SECONDS", 0.1)
    file = tmp_path / "keys"
    file.write_text("# the clients' keys\nold-key\n")

    async def status(key: str) -> int:
        r = await s.client.post("/embed", json={"inputs": "a"}, headers=bearer(key))
        return r.status_code

    async def within_a_reload(key: str, want: int) -> float:
        start = time.monotonic()
        while (got := await status(key)) != want:
            assert time.monotonic() - start < 2, f"{key}: still {got}"
        return time.monotonic() - start

    async with serve(Settings(model_dir=model_dir, api_keys_file=file)) as s:
        assert await status("old-key") == 200 and await status("new-key") == 401
        file.write_text("old-key\nnew-key   # added for the rotation\n")
        await within_a_reload("new-key", 200)
        assert await status("old-key") == 200  # both work while the clients move
        file.write_text("new-key\n")
        assert await within_a_reload("old-key", 401) < 1.0
        assert await status("new-key") == 200
        file.unlink()  # unreadable: the keys last read stay, nobody is locked out or let in
        time.sleep(0.15)
        assert await status("new-key") == 200 and await status("nobody") == 401


def test_keys_from_settings_and_file_add_up(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text("\n  b  \n# c\nd # e\n")
    k = Keys(SecretStr("a"), file)
    assert k.fixed | k.from_file == {b"a", b"b", b"d"}
    assert k.accepts(b"d") and not k.accepts(b"c") and not k.accepts(b"")
    assert parse_keys("x,, y ,", ",") == {b"x", b"y"}
    assert not Keys(None, None).enabled  # no key at all: open


def test_a_keys_file_that_cannot_be_read_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no such file"):
        Settings(model_dir=tmp_path, api_keys_file=tmp_path / "missing")
