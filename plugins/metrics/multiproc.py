"""Metrics of `gateway run --workers N`: the supervisor gives its workers one folder for
prometheus-client's multi-process mode, so a scrape of any worker answers for all of them.

The folder is made before the first worker starts (the mode is chosen when a process
first imports prometheus-client, so it must be in the workers' environment from the
start) and removed when the supervisor stops. A worker that dies is marked dead: its
gauges (holds open) leave the sum; its counters stay, as counters never go back.
An operator who sets PROMETHEUS_MULTIPROC_DIR themselves keeps their folder.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def shared_folder():
    """For the supervisor: a fresh folder in the workers' environment while they run."""
    if os.environ.get(DIR_VARIABLE):
        yield os.environ[DIR_VARIABLE]
        return
    folder = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[DIR_VARIABLE] = folder
    try:
        yield folder
    finally:
        os.environ.pop(DIR_VARIABLE, None)
        shutil.rmtree(folder, ignore_errors=True)


def worker_gone(pid: int) -> None:
    """A worker exited: its live gauges (holds open) leave the sum."""
    if os.environ.get(DIR_VARIABLE):
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid)
