"""Settings (design §13): a pydantic model read from the environment with the prefix ``KB_``.

Every setting, its default and its unit is listed in the README. ``Settings()`` reads the
environment each time it is constructed; tests build one explicitly with overrides.

The environment is read here (``_environment``), not by pydantic-settings: kb's settings are all
scalars (text, numbers, paths, one of a few words), which pydantic validates from text itself,
and importing pydantic-settings (its .env, CLI and cloud secret sources) cost every command that
opens kb 20-30 ms of CPU, a tenth of a ``kb log`` (bin/bench_cli_startup.py).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

ENV_PREFIX = "KB_"


def _default_storage_root() -> Path:
    import platformdirs  # only without KB_STORAGE_ROOT (design §13: what a command imports is what it uses)

    return platformdirs.user_data_path("kb", appauthor=False)


NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
"""What a node name may be (``kb.nodes.name``'s check): it is part of Procrastinate queue names."""


def _default_node() -> str:
    """The host name, cut at the first character a node name may not hold (design §15)."""
    name = re.split(r"[^A-Za-z0-9._-]", socket.gethostname())[0][:63].strip("._-")
    return name or "localhost"


def parse_listen(value: str | None) -> tuple[str, int] | None:
    """``"127.0.0.1:55432"`` → ``("127.0.0.1", 55432)``; None or ``""`` → None (socket only).

    IPv6 addresses are written in brackets (``[::1]:55432``). Raises ValueError naming the
    expected form when the value is not ``host:port`` with a port in 1-65535.
    """
    if not value:
        return None
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:55432)")
    return host, int(port)


def _environment(fields: dict[str, Any]) -> dict[str, str]:
    """The ``KB_*`` variables naming a setting, by field name (names read case-insensitively, as
    pydantic-settings read them; others are ignored)."""
    found = {}
    for key, value in os.environ.items():
        name = key.lower()
        if name.startswith("kb_") and name[3:] in fields:
            found[name[3:]] = value
    return found


class Settings(BaseModel):
    """kb's configuration. Environment variable = ``KB_`` + the upper-cased field name; a keyword
    argument overrides the environment. Raises pydantic's ValidationError for a refused value."""

    model_config = ConfigDict(extra="ignore", validate_default=True)  # as pydantic-settings did

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**_environment(type(self).model_fields), **values})

    database_url: str | None = Field(
        default=None,
        description="Postgres URL. Unset: an embedded Postgres 18 + pgvector under the storage root.",
    )
    storage_root: Path = Field(
        default_factory=_default_storage_root,
        description="Where workspace repositories (knowledge_store/) and the embedded database live.",
    )
    embedding_model: str = Field(
        default="auto",
        description=(
            "The default model of a workspace, recorded at its first index run: 'auto' (by the "
            "workspace's languages: MiniLM for English, use-m3 for others, falling back to what "
            "is installed, else hashing), 'minilm', 'use-m3', 'e5-small', 'hashing', "
            "'openai:<model>' for an OpenAI-compatible endpoint, or the path of a "
            "sentence-transformers model directory."
        ),
    )
    embedding_dim: int = Field(default=384, description="Vector dimension of the chunks table.")
    model_cache: Path | None = Field(
        default=None,
        description="Where ONNX exports of sentence-transformers models are kept (made once from the "
        "installed model, design §7). Default: {storage_root}/models.",
    )
    openai_base_url: str = Field(default="https://api.openai.com/v1")
    openai_api_key: str | None = None
    chunk_size: int = Field(default=240, description="Chunk size in tokens of the embedding model's own tokenizer.")
    embed_batch_size: int = Field(default=64, description="Chunks per embedder call.")
    lock_backend: Literal["postgres", "redis"] = "postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    lock_timeout: float = Field(
        default=10.0,
        ge=0,
        le=86400,  # a day; inf or 1e10 overflowed the write-key fence's wait (time_t) and Postgres' lock_timeout
        description="Seconds to wait for a workspace write lock (and a write-key fence, design §3). At most 86400.",
    )
    lock_ttl: float = Field(default=60.0, description="Seconds a Redis lock lives if its holder dies.")
    pool_timeout: float | None = Field(
        default=None,
        gt=0,
        le=86400,  # a day; inf or 1e10 would overflow the pool's wait (time_t) at the first connection
        description="Seconds a caller waits for a pooled database connection (every connection "
        "busy, or Postgres away) before DatabaseUnavailable; the worker then stops and restarts "
        "(design §7, §13). Default: 30; at most 86400.",
    )
    worktree_ttl: float = Field(default=86400.0, description="Seconds before an idle turn worktree is removed.")
    turn_idle_seconds: float = Field(
        default=900.0,
        ge=1,  # checked every quarter of it: less spun kb serve's loop (design §16)
        le=604800,
        description="Seconds after its last call that kb serve releases an HTTP API turn: its "
        "worktree lock and file are freed, its worktree stays for a later call of the turn id "
        "(design §5).",
    )
    turns_per_token: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Open HTTP API turns kb serve keeps for one API token (each holds a worktree "
        "lock, a file descriptor); a new one past it is refused until one is committed, aborted or "
        "released idle (design §16).",
    )
    mcp_chats_per_token: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Open MCP conversations kb serve keeps for one API token (without tokens, for "
        "all callers together); a new one past it is refused until one ends or is closed idle "
        "(design §16).",
    )
    mcp_chat_idle_seconds: float = Field(
        default=1800.0,
        ge=1,  # checked every quarter of it: less spun kb serve's loop (design §16)
        le=604800,
        description="Seconds after its last call that kb serve closes an MCP conversation as if "
        "its client had ended it: the turn is committed and what it held released (design §5).",
    )
    max_attempts: int = Field(default=3, description="Index attempts before a document is quarantined.")
    quarantine_retry_seconds: float = Field(
        default=3600.0,
        description="Seconds before the sweep gives a quarantined document one more attempt (once the "
        "embedder answers a probe again).",
    )
    max_index_bytes: int = Field(
        default=5_000_000,
        description="Documents larger than this many bytes are kept in git but marked unindexable.",
    )
    progress_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between `kb worker`'s progress lines when its output is not a terminal "
        "(a script's capture, a service manager's log).",
    )
    stalled_job_seconds: float = Field(
        default=60.0,
        description="Seconds without a worker heartbeat after which its running jobs are retried.",
    )
    maintenance_cron: str = Field(
        default="* * * * *",
        description="Cron of the sweep and the stalled-job retry (a 6th field counts seconds).",
    )
    pack_every_revisions: int = Field(
        default=32,
        ge=0,
        description="Revisions after which a workspace's loose git objects are packed (a `kb.pack_repository` "
        "job; 0: only by the 10-minute maintenance cron).",
    )
    job_retention_hours: int = Field(default=72, description="Hours succeeded jobs are kept.")
    index_cutter: Literal["auto", "process", "inline"] = Field(
        default="auto",
        description=(
            "Where an index run cuts its documents (chunks, context lines, hashes, languages): "
            "'process' in a child process of its own, a batch ahead of the embedder, so both use a core; "
            "'inline' in the run's process; 'auto' a child for runs of 2,048 documents or more on two "
            "cores or more (starting it costs about a second)."
        ),
    )
    fts_config: str = Field(
        default="auto",
        description=(
            "Postgres text search configuration of the full-text index: 'auto' detects each "
            "document's language and uses its configuration (kb.simple_unaccent, simple with "
            "accents folded, where Postgres has none), or "
            "one configuration name (e.g. 'english') for every document."
        ),
    )
    citation_ttl: float = Field(
        default=30 * 86400.0,
        description="Seconds a chat's citation handles live after its last use (search, read, normalize, resolve).",
        gt=0,
    )
    # span fill and drift check (design §9, §10); batch size, throttle and pause live in
    # the kb.span_fill_control row so a DBA can change them with psql while a fill runs.
    span_fill_cron: str = Field(default="23 3 * * *", description="Cron of the span fill (daily by default).")
    span_fill_job_seconds: float = Field(
        default=60.0, description="Seconds one span-fill job runs before it queues its continuation."
    )
    drift_cron: str = Field(default="*/30 * * * *", description="Cron of the drift check of flipped workspaces.")
    drift_max_repairs: int = Field(default=100, description="Drift findings repaired per workspace per run.")

    # -- connections: pooler, direct URL, embedded server's TCP address (design §13) ------------
    database_pooler: Literal["none", "transaction"] = Field(
        default="none",
        description=(
            "'transaction' when KB_DATABASE_URL goes through a transaction-mode pooler (PgBouncer "
            "pool_mode=transaction): no server-side prepared statements, no session state on it."
        ),
    )
    direct_database_url: str | None = Field(
        default=None,
        description=(
            "A URL reaching Postgres without the pooler, for session work (the worker's LISTEN). "
            "Default: KB_DATABASE_URL (behind a transaction pooler the worker then polls)."
        ),
    )
    embedded_listen: str | None = Field(
        default=None,
        description="host:port the embedded server also listens on over TCP, e.g. 127.0.0.1:55432 "
        "(for Zero and GUI clients). Default: its Unix socket only.",
    )

    move_window_seconds: float = Field(
        default=900.0,
        gt=0,
        description="Seconds a workspace move's read-only window stays open without progress (renewed at each "
        "step; design §15): an abandoned move's window expires and writes go on.",
    )

    # the CLI's read commands ask a running `kb serve` (kb/adapters/cli/main.py reads the variable itself)
    server_url: str | None = Field(
        default=None,
        description="URL of a running `kb serve` (e.g. http://127.0.0.1:8765): kb search/read/log/status ask it.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="The API token the CLI sends to KB_SERVER_URL as 'Authorization: Bearer' (design §16).",
    )
    max_request_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body `kb serve` accepts, in bytes; a larger one is refused with 413.",
    )

    # -- nodes (design §15): many hosts, one Postgres
    node: str = Field(
        default_factory=_default_node,
        description="This process's node name (letters, digits, '.', '_', '-'; default: the host name). "
        "Workspaces created here are homed on it; its worker runs their jobs.",
    )
    node_url: str | None = Field(
        default=None,
        description="The URL other nodes forward this node's workspaces' requests to (`kb serve` "
        "advertises it, e.g. http://kb-a:8765). Unset: the address `kb serve` listens on.",
    )
    node_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Seconds without a heartbeat after which a node counts as down (its workspaces' "
        "requests get NodeUnavailable). Nodes heartbeat every quarter of it.",
    )

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not NODE_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a node name (1-63 letters, digits, '.', '_', '-'; starting alphanumeric)"
            )
        return value

    @field_validator("embedded_listen")
    @classmethod
    def _listen_address(cls, value: str | None) -> str | None:
        parse_listen(value)  # ValueError → a validation error naming the variable
        return value or None

    # -- git remotes (design §13): credentials are read at push time, never stored
    remote_username: str | None = Field(default=None, description="User name for pushing to an https remote.")
    remote_password: SecretStr | None = Field(default=None, description="Password or token for the remote.")
    remote_credentials_file: Path | None = Field(
        default=None,
        description="A git-credentials file (lines https://user:token@host[/path]) to read at push time.",
    )
    remote_ssh_key: Path | None = Field(default=None, description="Private key file for ssh:// remotes.")

    @field_validator("storage_root", "model_cache")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else Path(value).expanduser().resolve()

    @property
    def knowledge_store(self) -> Path:
        """``{storage_root}/knowledge_store`` — one git repository per workspace (design §2.1)."""
        return self.storage_root / "knowledge_store"

    @property
    def worker_heartbeat_seconds(self) -> float:
        """How often a worker records its heartbeat in ``procrastinate_workers`` (design §7): a
        quarter of ``KB_STALLED_JOB_SECONDS``, at most 5 s, so a killed worker is noticed soon."""
        return min(self.stalled_job_seconds / 4, 5.0)

    @property
    def worker_alive_seconds(self) -> float:
        """A worker whose last heartbeat is older than this (three beats missed) is not counted as
        running (``kb workspaces``, ``kb import``; design §7): it was killed or lost its host."""
        return 3 * self.worker_heartbeat_seconds


def settings_error(exc: ValidationError) -> str:
    """One line naming each refused ``KB_*`` variable and why (for the CLI's error output)."""
    problems = [f"KB_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']}" for error in exc.errors()]
    return "invalid setting " + "; ".join(problems) + " (fix or unset the environment variable)"
