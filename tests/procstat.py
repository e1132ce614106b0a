"""What a process of a test holds, read from ``/proc`` (Linux): the memory tests' one reader."""

from __future__ import annotations


def memory(pid: int, field: str = "VmRSS") -> int:
    """Bytes of ``field`` of ``/proc/PID/status``: ``VmRSS`` (resident now) or ``VmHWM``
    (the resident peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")
