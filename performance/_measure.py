"""Running a command and measuring it, shared by the bench scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GNU_TIME = Path("/usr/bin/time")


def measured(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> tuple[float, float, float, int]:
    """Run cmd to completion -> (wall s, CPU s user+sys, peak RSS MB, exit code).

    GNU time measures the child: ru_maxrss survives fork+exec, so a child forked straight
    from this (large) process would report this process's RSS as its own floor.
    """
    stats = log.with_suffix(".time")
    wrapped = [str(GNU_TIME), "-f", "%U %S %M", "-o", str(stats), *cmd] if GNU_TIME.exists() else cmd
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(wrapped, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if GNU_TIME.exists():
        user, sys_, kb = stats.read_text().split("\n")[-2].split()
        return wall, float(user) + float(sys_), int(kb) / 1024, rc
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, rc


def write_result(path: Path, **fields: Any) -> None:
    """Write a bench result as JSON with how and where it was measured (the command, the
    date, the machine's CPUs and load at the end: these machines are noisy, so every number
    travels with its conditions), then say where it went."""
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")
