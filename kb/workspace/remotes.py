"""Push each workspace to a git remote (design §13): one push-only remote per workspace,
fast-forward only, never merged or force-pushed. ``kb.remote(workspace)`` hands out a :class:`Remote`.

- ``add(url, branch)`` refuses a remote whose branch exists and is not an ancestor of HEAD.
- Every revision's transaction defers ``kb.push_remote`` on queue ``push`` when the workspace has a
  remote (``kb.store.defer_convergence``; coalesced: no job is added while one waits; lock
  ``push:N``, never the workspace write lock). The job pushes the *current* HEAD; finding the
  remote already at HEAD it does nothing. A failure is recorded (``last_push_error``, redacted) and
  re-raised so Procrastinate retries it with exponential backoff; the sweep re-defers while the
  remote is behind.
- Transports are dulwich's: a local path or ``file://``, ``git://``, ``ssh://`` (or ``user@host:path``)
  and ``http(s)://``. Credentials come from ``KB_REMOTE_USERNAME``/``KB_REMOTE_PASSWORD`` or a
  git-credentials file named by ``KB_REMOTE_CREDENTIALS_FILE`` (``KB_REMOTE_SSH_KEY`` for ssh),
  are read at push time and handed to dulwich; a URL carrying a password is refused, so they are
  never in ``.git/config`` (nothing is written there), the URL, logs, ``kb status`` or Postgres.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from kb.db import database, nodes
from kb.db.sql import queries
from kb.errors import (
    InvalidInput,
    PushFailed,
    RemoteDiverged,
    RemoteExists,
    RemoteNotFound,
    RemoteUnreachable,
)
from kb.faults import fault_point
from kb.settings import Settings
from kb.store.knowledge_store import KnowledgeStore

if TYPE_CHECKING:
    from kb.db.database import Connection

log = logging.getLogger(__name__)

PUSH_TASK = "kb.push_remote"
ZERO_SHA = b"0" * 40
HTTP_TIMEOUT_SECONDS = 60
"""An http(s) remote that does not answer within this many seconds fails the attempt (retried later)."""
_BRANCH = re.compile(r"^(?!/)(?!.*(?:\.\.|//|@\{|\.lock/|/\.))[A-Za-z0-9._/-]{1,200}(?<![./])$")
_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:(?!//)")


@dataclass(frozen=True)
class Credentials:
    """A user name and password/token for one push; ``repr`` never shows the password."""

    username: str | None
    password: str | None

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password={'***' if self.password else None})"


@dataclass(frozen=True)
class RemoteStatus:
    """A workspace's remote and its push state (``kb remote show``, ``kb status``)."""

    workspace_id: int
    url: str
    branch: str
    last_pushed_revision: str | None
    last_pushed_at: datetime | None
    last_push_error: str | None
    push_failures: int
    head: str | None
    behind: bool


@dataclass(frozen=True)
class PushResult:
    """Outcome of one push: ``pushed`` True when the remote branch moved to ``revision``."""

    revision: str | None
    pushed: bool
    previous: str | None = None

    def as_dict(self) -> dict:
        """JSON-able form (what the push job returns)."""
        return {"revision": self.revision, "pushed": self.pushed, "previous": self.previous}


def check_url(url: str) -> str:
    """Validate a remote URL; returns it stripped. Raises InvalidInput for an empty URL, an
    unsupported scheme, or a URL carrying a password (credentials belong in the environment or the
    credentials file, never in the URL)."""
    if not isinstance(url, str) or not url.strip() or "\x00" in url or "\n" in url:
        raise InvalidInput("give the remote as a URL or path, e.g. https://forge.example/team/kb.git")
    url = url.strip()
    if _SCP_LIKE.match(url) or url.startswith("/"):
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("file", "git", "ssh", "http", "https"):
        raise InvalidInput(f"remote {redact_url(url)!r}: use an absolute path, file://, git://, ssh:// or https://")
    if parts.password is not None:
        raise InvalidInput(
            "the remote URL carries a password; remove it from the URL and give it in KB_REMOTE_PASSWORD "
            "or a credentials file (KB_REMOTE_CREDENTIALS_FILE) so it is never stored"
        )
    return url


def redact_url(url: str) -> str:
    """``url`` with any password in its user part replaced by ``***``."""
    return re.sub(r"(://[^/@:\s]*):[^@/\s]*@", r"\1:***@", url)


def _redact(text: str, credentials: Credentials | None) -> str:
    text = redact_url(text)
    if credentials and credentials.password:
        text = text.replace(credentials.password, "***")
    return text


def _credentials_from_file(path: Path, url: str) -> Credentials | None:
    """The best git-credentials line for ``url``: same scheme, host and port; the longest path prefix."""
    target = urlsplit(url)
    best, best_len = None, -1
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise RemoteUnreachable(f"the credentials file {path} cannot be read: {exc.strerror}") from None
    for line in lines:
        entry = urlsplit(line.strip())
        if not entry.scheme or entry.scheme != target.scheme or entry.hostname != target.hostname:
            continue
        if entry.port != target.port:
            continue
        prefix = entry.path.rstrip("/")
        if prefix and not (target.path == prefix or target.path.startswith(prefix + "/")):
            continue
        if len(prefix) > best_len:
            best_len = len(prefix)
            best = Credentials(
                unquote(entry.username) if entry.username else None, unquote(entry.password) if entry.password else None
            )
    return best


def resolve_credentials(settings: Settings, url: str) -> Credentials | None:
    """Credentials for ``url`` at push time: ``KB_REMOTE_USERNAME``/``KB_REMOTE_PASSWORD`` when
    set, else the matching line of ``KB_REMOTE_CREDENTIALS_FILE``, else None."""
    password = settings.remote_password.get_secret_value() if settings.remote_password else None
    if settings.remote_username or password:
        return Credentials(settings.remote_username, password)
    if settings.remote_credentials_file and "://" in url:
        return _credentials_from_file(settings.remote_credentials_file, url)
    return None


class Remote:
    """The remote of one workspace (design §13). Errors: RemoteNotFound, RemoteExists,
    RemoteDiverged, RemoteUnreachable, PushFailed, InvalidInput (all KbError, messages redacted)."""

    def __init__(self, store: KnowledgeStore) -> None:
        self.store = store
        self.workspace_id = store.workspace_id
        self.settings = store.settings

    # -- transport -----------------------------------------------------------------------
    def _client(self, url: str, credentials: Credentials | None):
        from dulwich.client import get_transport_and_path
        from dulwich.config import ConfigDict

        key = str(self.settings.remote_ssh_key) if self.settings.remote_ssh_key else None
        config = ConfigDict()  # in memory only: nothing is written to the repository's .git/config
        config.set((b"http",), b"timeout", str(HTTP_TIMEOUT_SECONDS).encode())
        try:
            return get_transport_and_path(
                url,
                config=config,
                operation="push",
                username=credentials.username if credentials else None,
                password=credentials.password if credentials else None,
                key_filename=key,
            )
        except ValueError as exc:
            raise InvalidInput(f"remote {redact_url(url)!r}: {exc}") from None

    def _remote_head(self, url: str, branch: str, credentials: Credentials | None) -> str | None:
        """The remote branch's commit id (None when absent); raises RemoteUnreachable."""
        client, path = self._client(url, credentials)
        try:
            refs = client.get_refs(path.encode()).refs
        except Exception as exc:  # dulwich, OS and HTTP errors alike: the remote is not usable
            raise RemoteUnreachable(
                f"remote {redact_url(url)} unreachable: {_redact(f'{type(exc).__name__}: {exc}', credentials)}"
            ) from None
        sha = (refs or {}).get(f"refs/heads/{branch}".encode())
        return None if sha in (None, ZERO_SHA) else sha.decode()

    def _contains(self, revision: str) -> bool:
        """True when ``revision`` is HEAD or one of its ancestors (kb's history is first-parent)."""
        with database.connect(self.store.database_url) as conn:
            if conn.execute(
                queries["revision_exists"], {"workspace_id": self.workspace_id, "revision_id": revision}
            ).fetchone():
                return True  # every recorded revision is on the branch (design §3)
        repo = self.store.repository
        try:  # a revision git has and Postgres has not recorded yet
            repo.commit(revision)
        except Exception:
            return False
        return revision in repo.ancestry(repo.head())

    # -- configuration -------------------------------------------------------------------
    def add(self, url: str, branch: str = "main") -> RemoteStatus:
        """Configure the workspace's remote after checking its branch is absent or an ancestor of
        HEAD, and defer a first push. Raises InvalidInput, RemoteExists, RemoteUnreachable,
        RemoteDiverged, WorkspaceNotFound."""
        url = check_url(url)
        if not isinstance(branch, str) or not _BRANCH.match(branch):
            raise InvalidInput(f"branch {branch!r}: give a plain branch name such as main")
        self.store.require_exists()
        if self.status_or_none() is not None:
            raise RemoteExists(
                f"workspace {self.workspace_id} already has a remote; `kb remote remove -w {self.workspace_id}` first"
            )
        remote_head = self._remote_head(url, branch, resolve_credentials(self.settings, url))
        if remote_head is not None and not self._contains(remote_head):
            raise RemoteDiverged(
                f"{redact_url(url)} branch {branch} is at {remote_head}, which is not in workspace "
                f"{self.workspace_id}'s history; kb never merges or force-pushes: use an empty branch"
            )
        with database.transaction(self.store.database_url) as conn:
            conn.execute(
                queries["ensure_workspace"],
                {"workspace_id": self.workspace_id, **nodes.node_params(self.store.settings)},
            )
            if (
                conn.execute(
                    queries["insert_remote"], {"workspace_id": self.workspace_id, "url": url, "branch": branch}
                ).fetchone()
                is None
            ):
                raise RemoteExists(f"workspace {self.workspace_id} already has a remote")
            conn.execute(queries["defer_push_if_remote"], {"workspace_id": self.workspace_id})
        return self.status()

    def status_or_none(self, conn: Connection | None = None) -> RemoteStatus | None:
        """The remote and its push state, or None when the workspace has none. ``conn``: an open
        connection to read it on (``kb status`` passes its own), else one is opened."""
        if conn is None:
            with database.connect(self.store.database_url) as own:
                return self.status_or_none(own)
        row = conn.execute(queries["remote_status"], {"workspace_id": self.workspace_id}).fetchone()
        if row is None:
            return None
        return RemoteStatus(
            row["workspace_id"],
            redact_url(row["url"]),
            row["branch"],
            row["last_pushed_revision"],
            row["last_pushed_at"],
            row["last_push_error"],
            row["push_failures"],
            row["head"],
            row["behind"],
        )

    def status(self) -> RemoteStatus:
        """The remote and its push state; raises RemoteNotFound."""
        found = self.status_or_none()
        if found is None:
            raise RemoteNotFound(
                f"workspace {self.workspace_id} has no remote; add one with `kb remote add URL -w {self.workspace_id}`"
            )
        return found

    def remove(self) -> None:
        """Forget the workspace's remote (nothing is deleted remotely). Raises RemoteNotFound."""
        with database.transaction(self.store.database_url) as conn:
            if conn.execute(queries["delete_remote"], {"workspace_id": self.workspace_id}).fetchone() is None:
                raise RemoteNotFound(f"workspace {self.workspace_id} has no remote")

    def defer_push(self) -> int | None:
        """Queue a push job (coalesced); returns its id, or None when one is already waiting."""
        self.status()
        with database.transaction(self.store.database_url) as conn:
            row = conn.execute(queries["defer_push_if_remote"], {"workspace_id": self.workspace_id}).fetchone()
        return row["id"] if row else None

    # -- pushing -------------------------------------------------------------------------
    def push(self) -> PushResult:
        """Push the current HEAD to the remote branch, fast-forward only (what the job runs).

        Does nothing when the remote is recorded at HEAD already. Never takes the write lock.
        Records success (``last_pushed_revision``/``_at``, error cleared) or failure (redacted
        ``last_push_error``) and then raises PushFailed for the job's retry. Raises RemoteNotFound.
        """
        remote = self.status()
        with database.connect(self.store.database_url) as conn:
            url = conn.execute(queries["remote_status"], {"workspace_id": self.workspace_id}).fetchone()["url"]
        head = self.store.head()
        if head is None or remote.last_pushed_revision == head:
            return PushResult(head, False, remote.last_pushed_revision)
        params = {"workspace_id": self.workspace_id, "url": url, "branch": remote.branch}
        credentials = None
        try:
            credentials = resolve_credentials(self.settings, url)
            previous = self._send(url, remote.branch, head, credentials)
        except Exception as exc:
            message = _redact(
                str(exc) if isinstance(exc, (RemoteDiverged, RemoteUnreachable)) else f"{type(exc).__name__}: {exc}",
                credentials,
            )[:2000]
            with database.transaction(self.store.database_url) as conn:
                conn.execute(queries["record_push_failure"], {**params, "error": message})
            log.warning("workspace %s: push to %s failed: %s", self.workspace_id, redact_url(url), message)
            raise PushFailed(f"workspace {self.workspace_id}: push to {redact_url(url)} failed: {message}") from None
        fault_point("push_sent")
        with database.transaction(self.store.database_url) as conn:
            conn.execute(queries["record_push_success"], {**params, "revision": head})
        log.info("workspace %s: pushed %s to %s (%s)", self.workspace_id, head, redact_url(url), remote.branch)
        return PushResult(head, previous != head, previous)

    def _send(self, url: str, branch: str, head: str, credentials: Credentials | None) -> str | None:
        """send-pack HEAD to ``refs/heads/<branch>`` if that is a fast-forward; returns the
        remote's previous commit id. Raises RemoteDiverged and whatever the transport raises."""
        client, path = self._client(url, credentials)
        ref, new = f"refs/heads/{branch}".encode(), head.encode()
        repo = self.store.repository._repo
        seen: dict[str, str | None] = {}

        def update_refs(refs: dict[bytes, bytes]) -> dict[bytes, bytes]:
            old = refs.get(ref)
            seen["old"] = None if old in (None, ZERO_SHA) else old.decode()
            if seen["old"] is not None and seen["old"] != head and not self._contains(seen["old"]):
                raise RemoteDiverged(
                    f"the remote branch {branch} is at {seen['old']}, not an ancestor of "
                    f"HEAD {head}: someone else pushed there; kb never force-pushes"
                )
            return {ref: new}

        def generate_pack_data(have, want, *, ofs_delta=False, progress=None):
            fault_point("push_sending")
            return repo.generate_pack_data(set(have), set(want), progress=progress, ofs_delta=ofs_delta)

        result = client.send_pack(path.encode(), update_refs, generate_pack_data=generate_pack_data)
        error = (result.ref_status or {}).get(ref)
        if error is not None:
            raise PushFailed(f"the remote refused {branch}: {error}")
        return seen.get("old")

    def check(self) -> str | None:
        """``kb fsck``: None when there is no remote, it is unreachable (reported as a note by the
        caller), or its branch is absent or an ancestor of HEAD; otherwise the problem."""
        found = self.status_or_none()
        if found is None:
            return None
        with database.connect(self.store.database_url) as conn:
            url = conn.execute(queries["remote_status"], {"workspace_id": self.workspace_id}).fetchone()["url"]
        try:
            remote_head = self._remote_head(url, found.branch, resolve_credentials(self.settings, url))
        except RemoteUnreachable as exc:
            log.info("fsck: %s", exc)
            return None
        if remote_head is None or self._contains(remote_head):
            return None
        return (
            f"remote {found.url} branch {found.branch} is at {remote_head}, which is not an ancestor of "
            f"HEAD; pushes will fail until it is reset to a revision of this workspace"
        )
