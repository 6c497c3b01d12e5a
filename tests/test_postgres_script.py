"""scripts/postgres.sh never uses a server it did not start, and says why it could not start
one (it used to print the URL of whatever answered on its port, and to fail initdb with the
script's own exit only)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from tests.postgres_support import server_url
from tests.service_support import unavailable

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "postgres.sh"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_postgresql_it_did_not_start_is_refused(tmp_path: Path) -> None:
    """The tests' own server answers on its port, but not from the folder named: refused,
    nothing printed on stdout, nothing made."""
    port = urlsplit(server_url()).port
    assert port is not None
    other = tmp_path / "other-cluster"
    done = run(tmp_path, AWL_PG_PORT=str(port), AWL_PG_DIR=str(other))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines() == [
        f"postgres.sh: a PostgreSQL server this script did not start (none of {other}) answers "
        f"on 127.0.0.1:{port}; stop it, or set AWL_PG_PORT to a free port (and AWL_PG_DIR to "
        "start another cluster)"]
    assert not other.exists()


def test_a_port_held_by_something_else_is_refused(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = run(tmp_path, AWL_PG_PORT=str(port), AWL_PG_DIR=str(tmp_path / "pg"))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines()[-1] == (
        f"postgres.sh: something that is not PostgreSQL listens on 127.0.0.1:{port}; stop it, "
        "or set AWL_PG_PORT to a free port")
    assert not (tmp_path / "pg").exists()


def test_an_initdb_that_fails_is_named_with_its_reason(tmp_path: Path) -> None:
    """As root, a cluster folder under a folder only root may enter (pytest's own, 0700) cannot
    be made by the postgres user: initdb's own reason is in the last line, with what to do.
    Not root: skipped on a developer's machine, failed under CI=true (CI runs as root)."""
    if os.geteuid() != 0:
        unavailable("as root only: the server then runs as postgres, who cannot reach a "
                    "folder only root may enter")
    server_url()  # the server is installed (and in CI, running)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    folder = closed / "pg"
    done = run(tmp_path, AWL_PG_PORT=str(free_port()), AWL_PG_DIR=str(folder))
    assert (done.returncode, done.stdout) == (1, "")
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"postgres.sh: initdb could not make the cluster in {folder}: "
                           "initdb: error: "), last
    assert "Permission denied" in last and "set AWL_PG_DIR elsewhere" in last
