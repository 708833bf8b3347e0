"""The CLI's side of ``kb serve`` (design §13): with ``KB_SERVER_URL`` set, ``kb search``, ``read``,
``log``, ``blame`` and ``status`` ask the running server (model already loaded) instead of opening kb.

Standard library only (``urllib``), so a command that talks to the server stays as light as
``python -c pass`` plus click. Results come back as kb's own objects (``Envelope``, ``Revision``),
so the CLI renders them the same way either path.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from typing import Any

from kb import errors
from kb.citations.envelope import Envelope

TIMEOUT_SECONDS = 60.0


class ServerClient:
    """JSON calls to one ``kb serve`` at ``base_url`` (``http://host:port``), sending ``token``
    (``KB_TOKEN``) as ``Authorization: Bearer`` when given (design §16)."""

    def __init__(self, base_url: str, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token.strip()}"} if token and token.strip() else {}

    def _get(self, route: str, **params) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.base_url}{urllib.parse.quote(route)}{'?' + query if query else ''}"
        try:
            request = urllib.request.Request(url, headers=self.headers)
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            raise _error_from(exc) from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc  # urllib's URLError wraps the socket's error
            reason = getattr(reason, "strerror", None) or reason
            raise errors.ServerUnavailable(
                f"kb server at {self.base_url} (KB_SERVER_URL) did not answer ({reason}); start `kb serve` "
                "or unset KB_SERVER_URL"
            ) from None

    def search(self, workspace_id: int, query: str, k: int) -> tuple[list[Envelope], str | None]:
        """Envelopes and the index-lag hint (None when the index is current)."""
        body = self._get(f"/v1/workspaces/{workspace_id}/search", q=query, k=k)
        return [envelope_from_json(e) for e in body["results"]], body["index"]["hint"]

    def read_document(self, workspace_id: int, path: str, revision: str | None = None) -> Envelope:
        """A document's full-view envelope."""
        return envelope_from_json(
            self._get(f"/v1/workspaces/{workspace_id}/documents/{path.lstrip('/')}", revision=revision)
        )

    def history(self, workspace_id: int, path: str | None, limit: int) -> list:
        """Revisions newest first."""
        return [revision_from_json(r) for r in self._get(f"/v1/workspaces/{workspace_id}/log", path=path, limit=limit)]

    def blame(self, workspace_id: int, path: str):
        """Each line's last revision (``kb.workspace.blame.Blame``)."""
        from kb.workspace.blame import Blame  # difflib and the history types: only for kb blame

        return Blame.from_json(self._get(f"/v1/workspaces/{workspace_id}/blame/{path.lstrip('/')}"))

    def status(self, workspace_id: int | None) -> dict:
        """``KnowledgeBase.status`` plus ``embedding_model``, with job times as datetimes again."""
        info = self._get("/v1/status", workspace=workspace_id)
        for job in [*info.get("blocked_jobs", []), *info.get("scheduled_jobs", [])]:
            for key in ("scheduled_at", "blocker_scheduled_at"):
                if job.get(key):
                    job[key] = datetime.fromisoformat(job[key])
            if job.get("due_in") is not None:
                job["due_in"] = timedelta(seconds=job["due_in"])
        return info


def _error_from(exc: urllib.error.HTTPError) -> errors.KbError:
    try:
        body = json.loads(exc.read())
    except ValueError:
        body = {}
    kind = getattr(errors, str(body.get("error")), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.KbError)):
        kind = errors.KbError if exc.code < 500 else errors.ServerUnavailable
    message = body.get("message") or body.get("detail") or f"HTTP {exc.code}"
    cli = body.get("cli_message")
    # Built without the class's own constructor: some take their parts (InvalidPath(path, reason)),
    # and the server sent the finished message, with the CLI's spelling of it.
    error = kind.__new__(kind)
    errors.KbError.__init__(
        error, message if isinstance(message, str) else json.dumps(message), cli=cli if isinstance(cli, str) else None
    )
    return error


def envelope_from_json(data: dict) -> Envelope:
    """The Envelope of ``Envelope.as_json()`` output."""
    cite = data.get("cite")
    return Envelope(
        data["path"],
        data["title"],
        data["revision"],
        data["view"],
        [(n, t) for n, t in data["lines"]],
        int(cite.strip("[]")) if cite else None,
        data.get("score"),
    )


def revision_from_json(data: dict):
    """The ``kb.store.history.Revision`` of the server's ``/log`` rows."""
    from kb.store.history import PathChange, Revision  # psycopg and dulwich: only for kb log

    when = data.get("committed_at")
    return Revision(
        data["id"],
        data["seq"],
        data["parent_id"],
        data["author"],
        data["committer"],
        data["message"],
        datetime.fromisoformat(when) if when else None,
        tuple(PathChange(**change) for change in data.get("changes", [])),
    )
