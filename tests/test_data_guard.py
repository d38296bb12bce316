"""The guard in tests/conftest.py: a test that opens ../shared/data without asking for it
fails with the data present, so `make test` proves the rest runs on a clone without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import _GUARD, REPO, SHARED_DATA


def test_opening_the_data_without_asking_fails_and_names_the_test() -> None:
    me = _GUARD.test
    assert me == "tests/test_data_guard.py::test_opening_the_data_without_asking_fails_and_names_the_test"  # fmt: skip
    try:
        for path in (SHARED_DATA / "sst2" / "train.tsv", REPO.parent / "shared" / "DESIGN.md"):
            with pytest.raises(RuntimeError, match="shared_data fixture"):
                path.open()
            _GUARD.test = me  # it fires once a test
    finally:
        _GUARD.test = me


def test_other_files_open_as_usual(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "a.txt").write_text("a")
    assert (tmp_path / "shared" / "a.txt").read_text() == "a"
    assert (REPO / "README.md").read_text()


def test_a_test_that_asks_may_open_it(shared_data: Path) -> None:
    assert _GUARD.test is None
    assert (shared_data / "README.md").read_text()
