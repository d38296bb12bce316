"""What a benchmark ran on: the CPU's model name, and what nvidia-smi says of the GPU (its name
and the memory in use)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path


def cpu_name() -> str:
    """ "AMD EPYC 9R14 ..." from /proc/cpuinfo; else what platform says."""
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


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
