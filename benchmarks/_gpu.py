"""What nvidia-smi says of the GPU a benchmark ran on: its name and the memory in use."""

from __future__ import annotations

import shutil
import subprocess


def nvidia_smi(query: str) -> str:
    """nvidia-smi's answer to --query-gpu=`query` (first GPU), or "" without one."""
    if shutil.which("nvidia-smi") is None:
        return ""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else ""


def gpu_name() -> str:
    """ "NVIDIA H200, 580.159.04" (name, driver), or "" without a GPU."""
    return nvidia_smi("name,driver_version")


def gpu_memory_mib() -> int | None:
    """Memory in use on the GPU, all processes (MiB), or None without one."""
    used = nvidia_smi("memory.used")
    return int(used) if used.isdigit() else None
