"""Every example a command's `--help` shows (training.*, demo.*) runs as written on a fresh clone: in one
empty folder holding only examples/ (the data the repository ships), in the order a user would
follow them (pretrain -> fine-tune -> export -> evaluate -> distill), each one's output the
next one's input. Only the step count changes (STEPS): the examples ask for 300 pretraining
steps, the test for two.

The floor test's build of the demo heads (tests/conftest.py `demo_models`) is linked into
models/, as `make models` would have left it: `demo.checks`' example reads
models/demo-ner, and `demo.models --out models` builds only what is missing
(minilm-embedding; the demo heads' build is the floor test's). `python -m service --help`'s example
is `make serve`'s command, run by CI's Docker stage and tests/test_readme.py's servers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO

pytest.importorskip("torch")

# In the order their examples build on each other.
COMMANDS = [
    "demo.data",
    "training.pretrain",
    "training.finetune",
    "training.export",
    "training.evaluate",
    "training.distill",
    "demo.models",
    "demo.checks",
]
STEPS = (re.compile(r"--steps \d+"), "--steps 2")


def help_text(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def examples(text: str) -> list[str]:
    """The runnable example lines of a --help text: `python -m ...` or `torchrun ...`, comments
    after `#` dropped."""
    found = []
    for line in text.splitlines():
        line = line.split("#")[0].strip().removeprefix("example:").strip()
        if line.startswith(("python -m ", "torchrun ")):
            found.append(line)
    return found


@pytest.mark.slow  # ~25 s: a process importing torch for each command
def test_every_command_shows_an_example_that_names_only_what_a_clone_has():
    for module in COMMANDS:
        shown = examples(help_text(module))
        assert shown, f"python -m {module} --help shows no example"
        for line in shown:
            assert "../shared" not in line and "..." not in line, line
            for path in re.findall(r"examples/\S+", line):
                assert (REPO / path).exists(), f"{path} (in: {line})"


def test_the_help_examples_run_as_written(tmp_path: Path, demo_models: Path):
    (tmp_path / "examples").symlink_to(EXAMPLES.parent)
    (tmp_path / "models").mkdir()
    for head in ("demo-sentiment", "demo-ner", "demo-qa"):  # so `--out models` builds the rest
        (tmp_path / "models" / head).symlink_to(demo_models / head)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    bindir = Path(sys.executable).parent
    ran = []
    for module in COMMANDS:
        for line in examples(help_text(module)):
            command = STEPS[0].sub(STEPS[1], line)
            if command.startswith("python "):
                command = f"{sys.executable} {command.removeprefix('python ')}"
            else:  # torchrun, from the same environment
                command = f"{bindir / 'torchrun'} {command.removeprefix('torchrun ')}"
            done = subprocess.run(
                command.split(), cwd=tmp_path, env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            ran.append(line)
    print("\n".join(["", "ran:", *ran]))
    assert (tmp_path / "models" / "sst2" / "package.json").is_file()
    assert (tmp_path / "models" / "minilm-embedding" / "package.json").is_file()
    assert (tmp_path / "runs" / "sst2-l1").is_dir()
