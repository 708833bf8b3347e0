"""Drift check for flipped workspaces (design §10): git HEAD is the truth; Postgres' document and
chunk rows must match it.

For each flipped workspace whose projection claims HEAD (a workspace still catching up is lag, the
sweep's business, not drift) the check compares HEAD's ``documents/`` tree with ``kb.documents``:

* ``missing_row``: a file no row mirrors; ``extra_row``: a row (with content) whose file is gone;
  ``content_mismatch``: a row whose ``content_id`` is not the file's blob id;
* ``index_mismatch``: a row marked ``indexed`` at content it no longer has (its chunks describe
  other bytes).

Repairs touch Postgres only, never git: row findings → a forced re-projection (``rebuild
projection``, ids of rows whose file exists kept); index findings → the documents go back to
``pending`` and an index job is queued. At most ``KB_DRIFT_MAX_REPAIRS`` findings per workspace are
repaired per run; a larger drift is recorded unrepaired for an operator (a sign something is badly
wrong, not to be churned through automatically). Findings of the latest check per workspace live in
``kb.drift_findings`` (summarised by the view ``kb.drift_report`` and ``kb status``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.locks import chunk_lock
from kb.db.sql import queries
from kb.store.homes import own_workspace_ids

if TYPE_CHECKING:
    from kb.store.stores import Stores

ROW_KINDS = ("missing_row", "extra_row", "content_mismatch")


@dataclass
class DriftReport:
    """One workspace's check: findings ``[{kind, path, detail, repaired}]``; ``skipped`` names why
    nothing was compared (projection behind HEAD, no repository)."""

    workspace_id: int
    revision: str | None
    findings: list[dict] = field(default_factory=list)
    skipped: str | None = None
    capped: bool = False

    @property
    def repaired(self) -> int:
        return sum(1 for f in self.findings if f["repaired"])

    def as_dict(self) -> dict:
        kinds: dict[str, int] = {}
        for finding in self.findings:
            kinds[finding["kind"]] = kinds.get(finding["kind"], 0) + 1
        return {
            "workspace": self.workspace_id,
            "revision": self.revision,
            "findings": kinds,
            "repaired": self.repaired,
            "capped": self.capped,
            "skipped": self.skipped,
        }


def compare(tree: dict[str, str], rows: list[dict]) -> list[dict]:
    """Findings of ``tree`` ({virtual path: blob id}, ``.keep`` excluded) against document rows."""
    findings = []
    by_path = {r["path"]: r for r in rows}
    for path, blob in sorted(tree.items()):
        row = by_path.get(path)
        if row is None:
            findings.append({"kind": "missing_row", "path": path, "detail": f"file {blob} has no row"})
        elif row["content_id"] != blob:
            findings.append(
                {
                    "kind": "content_mismatch",
                    "path": path,
                    "detail": f"row {row['id']} has {row['content_id']}, git has {blob}",
                }
            )
    for row in rows:
        if row["path"] not in tree and row["content_id"] is not None:
            findings.append({"kind": "extra_row", "path": row["path"], "detail": f"row {row['id']} has no file"})
        if row["status"] == "indexed" and row["indexed_content_id"] != row["content_id"]:
            findings.append(
                {
                    "kind": "index_mismatch",
                    "path": row["path"],
                    "id": row["id"],
                    "detail": f"indexed at {row['indexed_content_id']}, content {row['content_id']}",
                }
            )
    return findings


def drift_check(stores: Stores, workspace_id: int | None = None) -> list[DriftReport]:
    """Check every flipped workspace (or ``workspace_id``, flipped or not, if it was seeded) and
    repair within the cap; returns one DriftReport per workspace (see the module docstring)."""
    from kb.store.job_deferral import INDEX_TASK, defer_job

    cap = max(0, stores.settings.drift_max_repairs)
    with database.transaction(stores.database_url) as conn:
        targets = conn.execute(queries["drift_workspaces"], {"workspace_id": workspace_id}).fetchall()
    if workspace_id is None:  # the periodic check: the workspaces homed on this node (design §15)
        own = set(own_workspace_ids(stores.settings, stores.database_url))
        targets = [t for t in targets if t["workspace_id"] in own]
    reports = []
    for target in targets:
        ws = target["workspace_id"]
        store = stores.store(ws)
        head = store.head() if store.exists() else None
        report = DriftReport(ws, head)
        reports.append(report)
        if not store.exists():
            report.skipped = "no repository"
            continue
        if target["last_projected_revision"] != head:
            report.skipped = "projection behind HEAD (lag, handled by the sweep)"
            continue
        tree = {p: b for p, b in store.list_paths(head).items() if posixpath.basename(p) != ".keep"}
        with database.transaction(stores.database_url) as conn:
            rows = conn.execute(queries["drift_document_rows"], {"workspace_id": ws}).fetchall()
        report.findings = [{**f, "repaired": False} for f in compare(tree, rows)]
        row_findings = [f for f in report.findings if f["kind"] in ROW_KINDS]
        index_findings = [f for f in report.findings if f["kind"] == "index_mismatch"]
        budget = cap
        if row_findings:
            if len(row_findings) <= budget:
                stores.project(ws, force=True)
                for finding in row_findings:
                    finding["repaired"] = True
                budget -= len(row_findings)
            else:
                report.capped = True
        repair = index_findings[:budget]
        report.capped = report.capped or len(repair) < len(index_findings)
        with database.transaction(stores.database_url) as conn:
            if repair:
                # Lock order (kb.locks): the chunk lock before the document rows (several, in id
                # order; a projection locks them in path order).
                chunk_lock(conn, ws)
                conn.execute(queries["requeue_documents"], {"ids": [f["id"] for f in repair]})
                defer_job(conn, "index", INDEX_TASK, ws)
                for finding in repair:
                    finding["repaired"] = True
            conn.execute(queries["clear_drift_findings"], {"workspace_id": ws})
            with conn.cursor() as cur:
                cur.executemany(
                    queries["record_drift_finding"],
                    [
                        {
                            "workspace_id": ws,
                            "checked_revision": head,
                            "kind": f["kind"],
                            "path": f["path"],
                            "detail": f["detail"],
                            "repaired": f["repaired"],
                        }
                        for f in report.findings
                    ],
                )
    return reports


def drift_report(conn, workspace_id: int | None) -> list[dict]:
    """Rows of ``kb.drift_report`` (per workspace and kind: findings, repaired, checked_at)."""
    return conn.execute(queries["drift_report"], {"workspace_id": workspace_id}).fetchall()
