"""Files the desk keeps: readable and writable by their owner only (SEC-10).

The desk's file, its journals and everything else under the home folder hold orders,
reports, recorded arguments and token digests, so nobody but the owner may read them,
whatever the umask or the mode of the folder they are in.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["create_private", "make_private"]


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
