"""The content-addressed blob store of artifact files (design §11).

One store per workspace at ``{storage_root}/artifact_blobs/{workspace_id}``; a blob's bytes live at
``{sha256[:2]}/{sha256}``. ``put`` writes to a temporary file in the same folder, fsyncs it, renames
it into place and fsyncs the folder, so once ``put`` returns the blob survives a crash — artifacts
record a revision only after their blobs are durable. Writing the same bytes twice is a no-op.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kb.errors import BlobStoreError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def sha256_of(data: bytes) -> str:
    """Hex sha256 of ``data`` (a blob's address)."""
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore:
    """Content-addressed files under ``root`` (``root/ab/abcdef…``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha256: str) -> Path:
        """Where the blob ``sha256`` lives; raises ValueError for a malformed address."""
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str, size: int | None = None) -> bool:
        """True when the blob's file exists (with ``size`` bytes, when given)."""
        try:
            st = self.path(sha256).stat()
        except FileNotFoundError:
            return False
        return size is None or st.st_size == size

    def put(self, data: bytes) -> str:
        """Store ``data`` durably (written, fsynced, renamed, folder fsynced); returns its sha256.

        Idempotent: a blob already present with the right size is not rewritten. Raises
        BlobStoreError when the disk refuses the write (nothing is left behind but the temp file's
        removal is attempted).
        """
        digest = sha256_of(data)
        if self.has(digest, len(data)):
            return digest
        target = self.path(digest)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(target.parent)
        except OSError as exc:
            raise BlobStoreError(f"cannot store an artifact file under {self.root}: {exc}") from exc
        return digest

    def read(self, sha256: str) -> bytes:
        """The blob's bytes; raises BlobStoreError when it is missing or unreadable."""
        try:
            return self.path(sha256).read_bytes()
        except OSError as exc:
            raise BlobStoreError(f"artifact file {sha256} cannot be read from {self.root}: {exc}") from exc

    def verify(self, sha256: str) -> str | None:
        """None when the blob exists and hashes to its address; otherwise what is wrong."""
        try:
            digest = hashlib.sha256()
            with open(self.path(sha256), "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"unreadable ({exc})"
        return None if digest.hexdigest() == sha256 else f"content hashes to {digest.hexdigest()}"

    def remove(self, sha256: str) -> None:
        """Delete the blob (absent is fine). Raises OSError when the disk refuses."""
        with contextlib.suppress(FileNotFoundError):
            self.path(sha256).unlink()

    def addresses(self) -> Iterator[str]:
        """Every blob address present on disk (temp files of interrupted writes are skipped)."""
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir()):
            if folder.is_dir() and len(folder.name) == 2:
                for entry in sorted(folder.iterdir()):
                    if _SHA256.match(entry.name) and entry.name.startswith(folder.name):
                        yield entry.name

    def temp_files(self) -> list[Path]:
        """Temporary files of ``put`` calls: running ones, or left behind by a killed process."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*/.tmp-*") if p.is_file())
