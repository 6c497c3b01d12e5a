"""Files the desk keeps: readable and writable by their owner only (SEC-10).

The desk's file, its journals and everything else under the home folder hold orders,
reports, recorded arguments and token digests, so nobody but the owner may read them,
whatever the umask or the mode of the folder they are in.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

__all__ = ["OpenMark", "create_private", "make_private"]


def create_private(path: Path, data: bytes = b"") -> bool:
    """Create ``path`` with mode 0600 holding ``data``, unless it exists; True if created.

    The mode is set on the open file itself, so no umask widens or narrows it.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        if os.name != "nt":
            os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    return True


def make_private(path: Path) -> None:
    """Take every group and other permission off ``path``, when it exists and is ours."""
    if os.name == "nt":
        return  # POSIX modes do not describe Windows ACLs
    with contextlib.suppress(FileNotFoundError, PermissionError):
        st = os.stat(path)
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            os.chmod(path, st.st_mode & 0o700)


class OpenMark:
    """An ``flock`` on a file of its own, held shared by each process that has a desk open
    and exclusively by the one migrating it (BIND-22). The kernel lets go of it when the
    process ends, however it ends; the file itself is never removed (removing a lock file
    races with its next taker). Without ``flock`` (Windows) every attempt succeeds.

    Nothing here blocks except :meth:`share_after_migrating`, which waits only for another
    migrator's few statements.
    """

    def __init__(self, path: Path) -> None:
        # Not inherited by the processes this one starts (an upstream server outliving its
        # gateway must not keep the desk marked open).
        self._fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _try(self, how: int) -> bool:
        try:
            fcntl.flock(self._fd, how | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def try_shared(self) -> bool:
        """Hold it shared, unless a migrator holds it."""
        return fcntl is None or self._try(fcntl.LOCK_SH)

    def try_exclusive(self) -> bool:
        """Hold it alone, unless anyone else holds it at all."""
        return fcntl is None or self._try(fcntl.LOCK_EX)

    def share_after_migrating(self) -> None:
        """Go from exclusive to shared. Not atomic (``flock`` lets go first): another
        migrator may take it in between, finds nothing left to migrate, and lets go."""
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self) -> None:
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Let go of it (closing the file does)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
