"""A fuzz of kb serve's HTTP API from its OpenAPI document (design §16), shared by the CI sample
(tests/test_access.py) and the long run (bin/fuzz_http_api.py).

schemathesis draws requests for every operation — valid ones and ones of the wrong shape
(``GenerationMode.NEGATIVE``) — sent by a real HTTP client to a real ``kb serve``, each with one
of: no token, a malformed one, a read token for workspaces 1 and 2, a write token for workspace 1.
The workspace in the path is 1, 2 or what schemathesis drew. Rules: no response is a 5xx, and no
change lands without a write token for its workspace — checked per response (a 2xx to a turn
write by another token) and in git afterwards (workspace 2 is unchanged; every new revision of
workspace 1 has the write token as committer).
"""

from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass, field

import httpx

WRITE_METHODS = frozenset({"PUT", "POST", "DELETE", "PATCH"})


@dataclass
class FuzzReport:
    """What a fuzz run saw: requests sent, statuses, and the rule breaks (must be empty)."""

    requests: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    by_token: collections.Counter = field(default_factory=collections.Counter)
    server_errors: list[str] = field(default_factory=list)
    unauthorized_writes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        """One paragraph for a terminal or the closing note."""
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items(), key=str))
        tokens = "; ".join(
            f"{label} " + ", ".join(f"{s}: {n}" for (l2, s), n in sorted(self.by_token.items(), key=str) if l2 == label)
            for label in sorted({label for label, _ in self.by_token})
        )
        return (
            f"{self.requests} requests in {self.seconds:.1f} s; statuses {counts} (by token: {tokens}); "
            f"5xx: {len(self.server_errors)}; writes without a write token: {len(self.unauthorized_writes)}"
        )


def prepare(kb) -> tuple[dict[str, str | None], int, dict[int, str | None]]:
    """Workspaces 1 and 2 with a document each, and the tokens the fuzz sends. Returns
    ``({label: token or None}, the write token's id, {workspace: head before})``."""
    for ws in (1, 2):
        if kb.create_workspace(ws):
            with kb.transaction(ws, "seed", author="seed") as tx:
                tx.write("/documents/Plan.md", f"# Plan {ws}\n\nzebra refunds for workspace {ws}\n")
    reader = kb.tokens().create("fuzz-reader", "read", [1, 2])[1]
    writer_token, writer = kb.tokens().create("fuzz-writer", "write", [1])
    tokens = {"none": None, "malformed": "not-a-token", "reader": reader, "writer": writer}
    return tokens, writer_token.id, {ws: kb.head(ws) for ws in (1, 2)}


def run(base_url: str, tokens: dict[str, str | None], requests: int, seed: int) -> FuzzReport:
    """Send about ``requests`` drawn requests to the server at ``base_url``; returns the report."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    document = httpx.get(
        f"{base_url}/openapi.json", headers={"Authorization": f"Bearer {tokens['writer']}"}, timeout=60
    ).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    report = FuzzReport()
    started = time.perf_counter()

    @hypothesis_seed(seed)
    @settings(
        max_examples=requests,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data) -> None:
        # operation, token and workspace uniformly (hypothesis' own choices lean to the first one)
        rng = random.Random(data.draw(st.integers(0, 2**63)))
        operation = rng.choice(operations)
        case = data.draw(operation.as_strategy(rng.choice(modes)))
        if "workspace_id" in (case.path_parameters or {}):
            case.path_parameters["workspace_id"] = rng.choice([1, 1, 2, case.path_parameters["workspace_id"]])
        label = rng.choice(sorted(tokens))
        token = tokens[label]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = case.call(base_url=base_url, headers=headers, timeout=60)
        except Exception as exc:  # the request could not be sent as drawn (e.g. a header requests refuses)
            report.statuses[f"not sent ({type(exc).__name__})"] += 1
            return
        report.requests += 1
        report.statuses[response.status_code] += 1
        report.by_token[(label, response.status_code)] += 1
        what = f"{case.method} {case.formatted_path} as {label} → {response.status_code}: {response.text[:200]}"
        if response.status_code >= 500:
            report.server_errors.append(what)
        workspace = str((case.path_parameters or {}).get("workspace_id"))
        wrote = case.method.upper() in WRITE_METHODS and "/turns/" in operation.path
        if wrote and response.status_code < 300 and not (label == "writer" and workspace == "1"):
            report.unauthorized_writes.append(what)

    one()
    report.seconds = time.perf_counter() - started
    return report


def check_history(kb, writer_id: int, heads: dict[int, str | None], report: FuzzReport) -> None:
    """Add to ``report.unauthorized_writes`` any revision made without the write token: workspace 2
    must be at its old head, and workspace 1's new revisions must name the write token."""
    if kb.head(2) != heads[2]:
        report.unauthorized_writes.append(f"workspace 2 moved from {heads[2]} to {kb.head(2)}")
    committer = f"fuzz-writer <kb-token-{writer_id}>"
    for revision in kb.history(1, limit=100_000):
        if revision.id == heads[1]:
            break
        if revision.committer != committer:
            report.unauthorized_writes.append(f"revision {revision.id} of workspace 1 by {revision.committer}")
