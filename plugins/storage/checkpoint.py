"""SQLite's WAL checkpoints, taken off the calls' path.

A checkpoint copies the WAL's pages back into the database file and syncs both files to
disk. By default SQLite runs one inside whichever commit takes the WAL past 1,000 pages,
and the commit after it, which starts the WAL over, syncs the WAL's new header: those two
commits wait for three syncs, and so does every call queued behind them on the connection's
thread (at one call at a time, one call in about sixty: a p99 five times the p50).

Here a second connection, on a thread of its own, checkpoints after every
`CHECKPOINT_EVERY_COMMITS` commits of the writer. Its checkpoints are PASSIVE: they never
wait for the writer and the writer never waits for them (a commit appends to the WAL while
a checkpoint copies what came before). SQLite starts the WAL over only after a checkpoint
that no commit overlapped, which under steady load is only one the writer runs itself: so
the writer keeps its automatic checkpoint, at `WRITER_CHECKPOINT_PAGES`, as the bound on
the WAL's size. By then this thread has copied and synced nearly all of it, and the
writer's syncs come ten times less often than before."""
from __future__ import annotations

import sqlite3
import threading

import structlog

log = structlog.get_logger("storage")

CHECKPOINT_EVERY_COMMITS = 32
WRITER_CHECKPOINT_PAGES = 10_000     # the writer's own checkpoint: a WAL of up to ~40 MB at 4 KB pages


class Checkpointer:
    """Checkpoints the database at `path` on its own thread when enough commits are due."""

    def __init__(self, path: str, every: int = CHECKPOINT_EVERY_COMMITS):
        self.path, self.every = path, every
        self._commits = 0
        self._due = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """The writer committed once more (called on the event loop's thread: a count, and
        every `every` commits one wake-up of the checkpoint thread)."""
        self._commits += 1
        if self._commits >= self.every:
            self._commits = 0
            self._due.set()

    def close(self) -> None:
        """Stop after the checkpoint in progress, if any (blocks: call it off the event loop)."""
        self._stopping = True
        self._due.set()
        self._thread.join()

    def _serve(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:             # the writer's own checkpoint still bounds the WAL
            log.warning("sqlite_checkpoint_unavailable", error=str(exc))
            return
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:     # the writer's own checkpoint still bounds the WAL
                    log.warning("sqlite_checkpoint_failed", error=str(exc))
        finally:
            conn.close()
