"""The home folder, where a desk keeps its keys and (by default) its SQLite file.

``AWL_HOME`` names it, else ``./.awl`` in the working directory. A folder this module
creates is private to its owner and ignores itself in git, so a desk never ends up in a
commit by accident. The store may live elsewhere: a store URL (``--store``, else
``AWL_STORE``; see :mod:`awl.store.urls`) names it, and the home then holds only the keys.
"""

from __future__ import annotations

import os
from pathlib import Path

from awl.documents.errors import BadRequest, StoreUnavailable
from awl.store.files import create_private
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from awl.store.urls import STORE_ENV, open_store, store_settings

__all__ = ["DESK_FILE", "ENV_VAR", "default_store", "home_dir"]

ENV_VAR = "AWL_HOME"
DESK_FILE = "desk.sqlite3"


def home_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The home folder, created if absent.

    Args:
        explicit: A folder to use instead of ``AWL_HOME`` and ``./.awl``.

    Returns:
        The folder. When this call creates it, it is made with mode 0700 and given a
        ``.gitignore`` holding ``*``; an existing folder is left as it is.

    Raises:
        BadRequest: The path is empty, exists and is not a folder, or cannot be created.
    """
    path = _home_path(explicit)
    if path.is_dir():
        return path
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise BadRequest(
                f"the AWL home {path} exists and is not a folder; set {ENV_VAR} to a folder"
            ) from None
        return path  # another process created it first; it writes the .gitignore
    except OSError as exc:
        raise BadRequest(
            f"cannot create the AWL home {path} ({exc.strerror}); set {ENV_VAR} to a "
            "writable folder"
        ) from None
    create_private(path / ".gitignore", b"*\n")
    return path


def _home_path(explicit: str | os.PathLike[str] | None) -> Path:
    """Where the home is (see :func:`home_dir`), made or not."""
    if explicit is not None:
        if not os.fspath(explicit):
            # Path("") is the working folder: `--home "$DIR"` with DIR unset would quietly
            # make a desk there.
            raise BadRequest("the AWL home is given as an empty path; name a folder, or "
                             f"give none for ${ENV_VAR} (else ./.awl)")
        path = Path(explicit)
    elif os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
    else:
        path = Path.cwd() / ".awl"
    return path.expanduser()


def default_store(explicit: str | os.PathLike[str] | None = None, *,
                  url: str | None = None, checkpoint_every: float | None = None,
                  create: bool = True) -> Store:
    """The desk's store: the one ``url`` names, else the one ``AWL_STORE`` names, else the
    SQLite store in ``desk.sqlite3`` under :func:`home_dir` (``explicit``), checkpointed by a
    thread of its own every ``checkpoint_every`` seconds when given (see :class:`SQLiteStore`).
    ``create=False`` (a command that serves orders already issued) makes no home and no desk:
    a home that is not there, or holds no desk, is StoreUnavailable.

    Raises:
        BadRequest: the URL cannot name a store, or is empty (see :func:`awl.open_store`).
        StoreUnavailable: the store cannot be opened; nothing was written.
    """
    # An empty URL given is refused by open_store, never taken for "use the default":
    # `--store "$URL"` with URL unset would quietly open another desk.
    chosen = url if url is not None else os.environ.get(STORE_ENV) or None
    if chosen is not None:
        return open_store(chosen)
    if not create:
        desk = _home_path(explicit) / DESK_FILE
        if not desk.is_file():
            raise StoreUnavailable(
                f"there is no desk at {desk}: check --home (or ${ENV_VAR}, else ./.awl) names "
                "the folder the order was issued in (`awl order create` makes a desk there); "
                "nothing was made")
        return SQLiteStore(desk, checkpoint_every=checkpoint_every,
                           timeout=store_settings()[0])
    timeout = store_settings()[0]  # refused before the home is made
    return SQLiteStore(home_dir(explicit) / DESK_FILE, checkpoint_every=checkpoint_every,
                       timeout=timeout)
