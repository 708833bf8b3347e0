"""Copying a workspace's repository between nodes for a move (design §15).

The files a workspace owns on its home node are its git repository (``{knowledge_store}/{id}``)
and its artifact files (``{storage_root}/artifact_blobs/{id}``). A move copies both to the target
node as one archive the target *pulls* from the home node over HTTP (``kb serve``'s internal
route, ``kb.adapters.http.moves``), so two nodes need no shared file system:

* **archive** (home node): ``git bundle create --all`` of the repository (git's own transport
  format: every ref and the objects they reach) plus the artifact files, in one tar file written
  under ``{knowledge_store}/.moves/`` and streamed by the route; the caller removes it.
* **receive** (target node): download the archive into ``{knowledge_store}/.incoming-{id}-{move}``,
  build a repository with kb's config there (``Repository.create``), ``git fetch`` the bundle's
  refs into it, write the recorded identity, check out the working tree (``git reset --hard``),
  then **verify**: ``git fsck --strict``, its HEAD is the head Postgres records, every artifact
  file hashes to its name. Then rename the copy into place. A copy already in place that passes the same checks is
  kept (a resumed move); any other one is renamed aside (``.stale-{id}-*``), never deleted.
* **retire** (old home, after the flip): rename the old copy aside (``.moved-{id}-*``): it is no
  longer authoritative but stays on disk until an operator removes it.

Each step is safe to repeat and to kill: nothing here touches the authoritative copy, and the
target's copy is not authoritative until the flip in Postgres (``kb.workspace.moves``).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb.errors import ConfigurationError, MoveFailed, WorkspaceBusy
from kb.git.repository import Repository
from kb.workspace.artifacts import artifact_blobs_path
from kb.workspace.blobstore import BlobStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from kb.settings import Settings

BUNDLE = "repository.bundle"
"""The archive member holding the git bundle."""
META = "move.json"
"""The archive member describing the copy: workspace, head, identity."""
ARTIFACTS = "artifact_blobs"
"""The archive folder holding the artifact files (``ab/abcdef…``, as on disk)."""
DOWNLOAD_CHUNK = 1 << 20
"""Bytes read per step while downloading an archive."""


@dataclass(frozen=True)
class ReceivedCopy:
    """What a target node verified about the copy it holds: its HEAD (None for an empty
    repository), its identity, how many artifact files came with it, whether an earlier copy in
    place was kept (a resumed move) and the bytes downloaded."""

    workspace_id: int
    head: str | None
    repository_id: str | None
    artifact_files: int
    kept: bool
    bytes: int


def _git(cwd: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    """Run the git CLI in ``cwd`` (kb's fixed environment, as ``kb fsck``); raises
    ConfigurationError when git is missing."""
    executable = shutil.which("git")
    if executable is None:
        raise ConfigurationError("moving a workspace runs the git CLI but no `git` executable is on PATH; install git")
    return subprocess.run(
        [executable, "--no-optional-locks", "-C", str(cwd), *args],
        capture_output=True,
        timeout=timeout,
        env={"LC_ALL": "C", "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    )


def _fail(workspace_id: int, step: str, detail: str) -> MoveFailed:
    return MoveFailed(
        f"workspace {workspace_id}: the move stopped at {step}: {detail}. The workspace stays on its home "
        f"node, unchanged; run the same `kb workspace move` again to resume, or "
        f"`kb workspace move {workspace_id} --abort` to cancel it"
    )


# -- home node -----------------------------------------------------------------------------
def write_archive(settings: Settings, workspace_id: int, repository_path: Path, meta: dict) -> Path:
    """Write the archive of the workspace's repository and artifact files (see the module
    docstring) under ``{knowledge_store}/.moves/`` and return its path; the caller removes it.
    ``meta`` (head, identity) goes in as ``move.json``. Raises MoveFailed when git cannot bundle
    the repository, ConfigurationError without git."""
    folder = settings.knowledge_store / ".moves"
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{workspace_id}-{uuid.uuid4().hex}"
    bundle, archive = stem.with_suffix(".bundle"), stem.with_suffix(".tar")
    try:
        if meta.get("head") is not None:
            made = _git(repository_path, "bundle", "create", "--quiet", str(bundle), "--all")
            if made.returncode != 0:
                raise _fail(workspace_id, "the copy", f"git bundle failed: {made.stderr.decode(errors='replace')}")
        blobs = artifact_blobs_path(settings.storage_root, workspace_id)
        with tarfile.open(archive, "w") as tar:
            data = json.dumps(meta).encode()
            info = tarfile.TarInfo(META)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            if bundle.exists():
                tar.add(bundle, BUNDLE)
            if blobs.is_dir():
                tar.add(blobs, ARTIFACTS)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    finally:
        bundle.unlink(missing_ok=True)
    return archive


def retire(settings: Settings, workspace_id: int, move_id: str) -> list[str]:
    """On the old home node after the flip: rename the workspace's repository and artifact files
    aside (``.moved-{id}-{move}``; repeating it is a no-op). Returns the paths renamed."""
    return _aside(settings, workspace_id, f".moved-{workspace_id}-{move_id}")


def _aside(settings: Settings, workspace_id: int, name: str) -> list[str]:
    renamed = []
    repository = settings.knowledge_store / str(workspace_id)
    blobs = artifact_blobs_path(settings.storage_root, workspace_id)
    for path, target in (
        (repository, settings.knowledge_store / name),
        (blobs, blobs.parent / name),
    ):
        if path.exists():
            if target.exists():  # an earlier attempt of the same name: keep both
                target = target.with_name(f"{target.name}-{int(time.time())}")
            path.rename(target)
            renamed.append(str(target))
    return renamed


def discard(settings: Settings, workspace_id: int, move_id: str) -> list[str]:
    """On a target node whose move was aborted: rename its (never authoritative) copy aside
    (``.stale-{id}-{move}``) and remove the move's download folder. Returns the paths renamed.
    The caller checks that this node is not the workspace's home."""
    shutil.rmtree(_incoming(settings, workspace_id, move_id), ignore_errors=True)
    return _aside(settings, workspace_id, f".stale-{workspace_id}-{move_id}")


# -- target node ---------------------------------------------------------------------------
def _incoming(settings: Settings, workspace_id: int, move_id: str) -> Path:
    return settings.knowledge_store / f".incoming-{workspace_id}-{move_id}"


@contextlib.contextmanager
def _receiving(settings: Settings, workspace_id: int) -> Iterator[None]:
    """One receive of a workspace at a time on this node (an ``flock``: a killed holder releases)."""
    settings.knowledge_store.mkdir(parents=True, exist_ok=True)
    fd = os.open(settings.knowledge_store / f".incoming-{workspace_id}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _verified(path: Path, head: str | None, identity: str | None) -> str | None:
    """None when the repository at ``path`` passes ``git fsck --strict``, has HEAD ``head`` and
    identity ``identity``; else why not."""
    if not (path / ".git").is_dir():
        return f"no repository at {path}"
    with Repository.open(path) as repo:
        found_head, found_identity = repo.head(), repo.identity()
    if found_head != head:
        return f"its HEAD is {found_head}, Postgres records {head}"
    if identity is not None and found_identity != identity:
        return f"its identity is {found_identity}, Postgres records {identity}"
    checked = _git(path, "fsck", "--strict", "--no-progress", "--no-dangling", "--no-reflogs")
    if checked.returncode != 0:
        return "git fsck failed: " + (checked.stdout + checked.stderr).decode(errors="replace").strip()[:2000]
    return None


def _blobs_verified(root: Path) -> tuple[int, str | None]:
    """``(files, problem)``: every artifact file under ``root`` must hash to its name."""
    store, count = BlobStore(root), 0
    for address in store.addresses() if root.is_dir() else ():
        count += 1
        if (problem := store.verify(address)) is not None:
            return count, problem
    return count, None


def download(url: str, target: Path, timeout: float = 60.0, token: str | None = None) -> int:
    """GET ``url`` into ``target`` (streamed, fsynced), sending ``token`` as the bearer token
    (design §16); returns the bytes written. Raises OSError (urllib's URLError and HTTPError are
    ones; HTTPError carries the body)."""
    written = 0
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(target, "wb") as out:
        while chunk := response.read(DOWNLOAD_CHUNK):
            out.write(chunk)
            written += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return written


def receive(
    settings: Settings,
    workspace_id: int,
    move_id: str,
    archive_url: str,
    expected: Callable[[], tuple[str | None, str | None]],
    token: str | None = None,
) -> ReceivedCopy:
    """On the target node: pull, verify and place the workspace's copy (see the module
    docstring). ``archive_url``: the home node's archive route; ``expected()``: the head and
    identity Postgres records, asked before and again after the download (the home node records
    any revision its git has and Postgres lacks before it bundles); ``token``: the bearer token the
    home node checks (the one the move's caller sent, design §16). The caller checks that this
    node is the move's target and not the workspace's home. Returns the ReceivedCopy. Raises
    MoveFailed (download or check failed: nothing in place changed except a stale copy renamed
    aside), WorkspaceBusy (the home node refused: open turns)."""
    repository = settings.knowledge_store / str(workspace_id)
    blobs = artifact_blobs_path(settings.storage_root, workspace_id)
    head, identity = expected()
    with _receiving(settings, workspace_id):
        if _verified(repository, head, identity) is None:
            files, problem = _blobs_verified(blobs)
            if problem is None:  # a resumed move: the copy in place is already the right one
                return ReceivedCopy(workspace_id, head, identity, files, True, 0)
        incoming = _incoming(settings, workspace_id, move_id)
        shutil.rmtree(incoming, ignore_errors=True)  # an interrupted earlier attempt
        incoming.mkdir(parents=True)
        try:
            archive = incoming / "archive.tar"
            try:
                size = download(archive_url, archive, token=token)
            except urllib.error.HTTPError as exc:
                body = exc.read().decode(errors="replace")[:2000]
                with contextlib.suppress(ValueError, AttributeError):
                    refused = json.loads(body)
                    if refused.get("error") == "WorkspaceBusy":
                        raise WorkspaceBusy(refused["message"], cli=refused.get("cli_message")) from None
                raise _fail(workspace_id, "the copy", f"the home node answered {exc.code}: {body}") from None
            except OSError as exc:
                raise _fail(workspace_id, "the copy", f"the home node's archive could not be read ({exc})") from None
            with tarfile.open(archive) as tar:
                tar.extractall(incoming / "x", filter="data")
            archive.unlink()
            head, identity = expected()
            meta = json.loads((incoming / "x" / META).read_text())
            if meta.get("head") != head or (identity is not None and meta.get("repository_id") != identity):
                raise _fail(
                    workspace_id,
                    "verification",
                    f"the home node sent head {meta.get('head')} / identity {meta.get('repository_id')}, Postgres "
                    f"records {head} / {identity}",
                )
            copy = incoming / "repository"
            Repository.create(copy).close()
            bundle = incoming / "x" / BUNDLE
            if bundle.exists():
                fetched = _git(copy, "fetch", "--quiet", "--update-head-ok", str(bundle), "+refs/*:refs/*")
                if fetched.returncode != 0:
                    raise _fail(
                        workspace_id, "the copy", f"git fetch failed: {fetched.stderr.decode(errors='replace')}"
                    )
            with Repository.open(copy) as repo:
                if identity is not None:
                    repo.set_identity(identity)
            if (problem := _verified(copy, head, identity)) is not None:
                raise _fail(workspace_id, "verification", problem)
            files, problem = _blobs_verified(incoming / "x" / ARTIFACTS)
            if problem is not None:
                raise _fail(workspace_id, "verification", f"artifact file: {problem}")
            if head is not None:  # the working tree and index from HEAD, by git itself (kb's config holds)
                checked_out = _git(copy, "reset", "--quiet", "--hard", head)
                if checked_out.returncode != 0:
                    raise _fail(
                        workspace_id, "the copy", f"git reset failed: {checked_out.stderr.decode(errors='replace')}"
                    )
            _aside(settings, workspace_id, f".stale-{workspace_id}-{move_id}")  # a copy of an earlier attempt
            if (incoming / "x" / ARTIFACTS).is_dir():
                blobs.parent.mkdir(parents=True, exist_ok=True)
                (incoming / "x" / ARTIFACTS).rename(blobs)
            copy.rename(repository)  # last: the repository's presence says the copy is whole
            shutil.rmtree(incoming, ignore_errors=True)
            return ReceivedCopy(workspace_id, head, identity, files, False, size)
        except BaseException:  # refused, failed or interrupted: no partial copy stays behind
            shutil.rmtree(incoming, ignore_errors=True)
            raise
