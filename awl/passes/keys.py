"""The desk's signing keys (:class:`KeyStore`) and a verifier's live view of them
(:class:`KeySet`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from awl.documents.errors import BadRequest, NotFound, PassError
from awl.passes.common import ALGORITHM, PASS_TYPE, b64encode
from awl.store.protocol import KeyDirectory

__all__ = ["KeySet", "KeyStore"]

_KID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _thumbprint(x: str) -> str:
    # RFC 7638: the required members only, sorted, no whitespace.
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x},
                           separators=(",", ":"), sort_keys=True)
    return b64encode(hashlib.sha256(canonical.encode("ascii")).digest())


def _public_x(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64encode(raw)


class KeyStore:
    """The desk's Ed25519 signing keys, kept under ``<home>/keys/``.

    The folder is created owner-only (0700) and every key file owner-only (0600); a key file
    or folder that group or others can open is refused, never used. ``kid`` is the key's
    RFC 7638 thumbprint. :meth:`rotate` makes a new current key and keeps the old ones in the
    JWKS, so passes they signed verify until they expire.

    Files: ``<kid>.pem`` (PKCS #8 private key) per key, and ``current`` naming the signing kid.
    """

    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.folder = Path(home) / "keys"
        """Where the key files live."""

    # Files ---------------------------------------------------------------------------
    def _check_mode(self, path: Path, st: os.stat_result) -> None:
        if os.name == "nt":
            return  # POSIX modes do not describe Windows ACLs
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            fix = 700 if kind == "folder" else 600
            raise PassError(
                f"key {kind} {path} is open to group or others (mode {mode:04o}); "
                f"run `chmod {fix} {path}` and check nobody else copied it",
                reason="insecure_key")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise PassError(f"key {path} belongs to another user; the desk's own keys only",
                            reason="insecure_key")

    def _ensure_folder(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_mode(self.folder, self.folder.stat())

    def _write_new(self, name: str, data: bytes) -> None:
        # O_EXCL: a key file is written once, by one process, owner-only from the start.
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _read(self, name: str) -> bytes:
        path = self.folder / name
        fd = os.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            self._check_mode(path, os.fstat(f.fileno()))  # the file we read, not a swapped one
            return f.read()

    def _new_key(self) -> str:
        # A kid is typed as a command word (`awl pass retire KID`); one that began with "-"
        # would read as an option there, so such a key (1 in 64) is drawn again.
        while True:
            key = Ed25519PrivateKey.generate()
            kid = _thumbprint(_public_x(key.public_key()))
            if not kid.startswith("-"):
                break
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        self._write_new(f"{kid}.pem", pem)
        return kid

    def _point_current(self, kid: str, *, replace: bool) -> None:
        tmp = f".current.{secrets.token_hex(8)}"
        self._write_new(tmp, kid.encode("ascii"))
        try:
            if replace:
                os.replace(self.folder / tmp, self.folder / "current")
            else:
                # link() fails when another process made the first key first; theirs wins.
                with contextlib.suppress(FileExistsError):
                    os.link(self.folder / tmp, self.folder / "current")
        finally:
            (self.folder / tmp).unlink(missing_ok=True)

    # Public ---------------------------------------------------------------------------
    @property
    def current_kid(self) -> str:
        """The kid new passes are signed with (a key is made on first use)."""
        self._ensure_folder()
        if not (self.folder / "current").exists():
            self._point_current(self._new_key(), replace=False)
        return self._read("current").decode("ascii").strip()

    def kids(self) -> list[str]:
        """Every kid kept, the current one included, sorted."""
        self._ensure_folder()
        return sorted(p.stem for p in self.folder.glob("*.pem"))

    def private_key(self, kid: str) -> Ed25519PrivateKey:
        """The private key ``kid``.

        Raises:
            PassError: ``unknown_kid`` when there is no such key, ``insecure_key`` when its
                file is open to others.
        """
        self._ensure_folder()
        # A kid is a base64url thumbprint; anything else never names a file here.
        if _KID.fullmatch(kid) is None or not (self.folder / f"{kid}.pem").is_file():
            raise PassError(f"no signing key {kid!r} in {self.folder}", reason="unknown_kid")
        try:
            key = serialization.load_pem_private_key(self._read(f"{kid}.pem"), password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise PassError(f"key file {self.folder / kid}.pem is not an unencrypted Ed25519 "
                            "PEM key; remove it or restore it from a backup",
                            reason="insecure_key")
        return key

    def rotate(self) -> str:
        """Make a new current signing key and return its kid; old keys stay published."""
        self._ensure_folder()
        kid = self._new_key()
        self._point_current(kid, replace=True)
        return kid

    def retire(self, kid: str) -> None:
        """Delete key ``kid`` for good, so every pass it signed stops verifying (DP-13).

        Verifiers that read this folder (a :class:`KeySet`: the gateway, the desk) refuse
        those passes, and every pass derived from one, from their next request on.

        Raises:
            NotFound: there is no key ``kid``.
            BadRequest: ``kid`` is the current signing key (rotate first).
        """
        self._ensure_folder()
        if _KID.fullmatch(kid) is None or not (self.folder / f"{kid}.pem").is_file():
            raise NotFound(f"no signing key {kid!r} in {self.folder}; `awl pass jwks` lists "
                           "the kids")
        if kid == self.current_kid:
            raise BadRequest(f"{kid} is the current signing key; run `awl pass rotate` first, "
                             "then retire it")
        (self.folder / f"{kid}.pem").unlink()

    def key_files(self) -> frozenset[str]:
        """The names of the key files kept now: one directory listing, no key is read."""
        try:
            return frozenset(n for n in os.listdir(self.folder) if n.endswith(".pem"))
        except FileNotFoundError:
            return frozenset()

    def jwks(self) -> dict[str, Any]:
        """The public JWKS document: every kept key's public part, current key first."""
        current = self.current_kid
        keys = []
        for kid in sorted(self.kids(), key=lambda k: k != current):
            x = _public_x(self.private_key(kid).public_key())
            keys.append({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid,
                         "alg": ALGORITHM, "use": "sig"})
        return {"keys": keys}

    def sign(self, claims: Mapping[str, Any], *, parent: str | None = None) -> str:
        """Sign ``claims`` as a pass with the current key, no questions asked.

        This is the raw signer under :func:`issue_pass`, which checks the claims first;
        call it directly only to make test tokens.
        """
        kid = self.current_kid
        headers: dict[str, Any] = {"typ": PASS_TYPE, "kid": kid}
        if parent is not None:
            headers["parent"] = parent
        payload = json.dumps(dict(claims), separators=(",", ":"), sort_keys=True)
        return jwt.api_jws.encode(payload.encode("utf-8"), self.private_key(kid),
                                  algorithm=ALGORITHM, headers=headers)


class KeySet:
    """The public key set of a desk's keys folder for a running verifier, always current.

    Calling it returns the JWKS document. It lists the folder on every call and reads the
    keys again whenever a key file was added (``awl pass rotate``) or removed (``awl pass
    retire``), so a long-running gateway trusts exactly the keys kept now, from the next
    request on, without a restart (DP-13).
    """

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        """Where the keys are read from."""
        self._known: tuple[frozenset[str], dict[str, Any]] | None = None

    def __call__(self) -> dict[str, Any]:
        names = self.keys.key_files()  # listed before reading: a change after it reloads
        known = self._known
        if known is not None and known[0] == names:
            return known[1]
        jwks = self.keys.jwks()
        self._known = (names, jwks)
        return jwks


def publish_keys(store: object, keys: KeyStore) -> None:
    """Publish the public key set of ``keys`` in ``store`` if it keeps one (else nothing)."""
    if isinstance(store, KeyDirectory):
        store.publish_keys(keys.jwks())


class PublishedKeySet:
    """The public key set a :class:`~awl.store.protocol.KeyDirectory` store keeps, for a
    running verifier.

    Calling it reads the set again, so a key rotated in or retired on the desk's host
    counts from the next request on (DP-13), as with :class:`KeySet`.
    """

    def __init__(self, store: KeyDirectory) -> None:
        self.store = store

    def __call__(self) -> dict[str, Any]:
        found = self.store.published_keys()
        if found is None:
            raise PassError("the desk's store holds no public keys yet; issue a pass on the "
                            "desk (or run `awl pass rotate --store URL` there) to publish them",
                            reason="unknown_kid")
        return found
