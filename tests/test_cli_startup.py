"""(design §13) what a one-shot command skips at start-up, and that skipping never hides a problem.

The quick paths (the embedded server's recorded check, the schema's one-read check, the paused
garbage collector) are proved here to fall back to the full path whenever their premise fails.
Their speed is measured by bin/bench_cli_startup.py, never asserted here.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from support.commands import run_cli
from support.named_queries import queries

from kb.adapters.cli.main import main
from kb.db import database
from kb.db.embedded_server import VERIFIED_MARKER, _record_verified, _verified_url, forget_verified
from kb.db.migrations import schema_is_current
from kb.errors import MigrationError
from kb.knowledge_base import KnowledgeBase

# -- the embedded server's recorded check -------------------------------------------------------


def _postmaster_pid(
    pgdata: Path, *, pid: int, started: int, port: int = 5432, listen: str = "", status: str = "ready"
) -> None:
    """Write ``postmaster.pid`` in Postgres' own layout for a process of this machine."""
    pgdata.mkdir(parents=True, exist_ok=True)
    lines = [str(pid), str(pgdata), str(started), str(port), str(pgdata), listen, "  1234  5678", status]
    (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")


def _this_process_started() -> int:
    return int(time.time()) - 60


def test_recorded_check_answers_for_the_same_live_postmaster_only(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    started = _this_process_started()
    _postmaster_pid(pgdata, pid=os.getpid(), started=started)
    assert _verified_url(pgdata, "kb", None) is None  # nothing recorded yet: the full check runs

    _record_verified(pgdata, "kb", None)
    url = _verified_url(pgdata, "kb", None)
    assert url is not None and "port=5432" in url and "/kb?" in url
    assert _verified_url(pgdata, "other", None) is None  # a database the full check never made
    assert _verified_url(pgdata, "kb", ("127.0.0.1", 5432)) is None  # other addresses asked for

    # The same pid with another start time than recorded: another postmaster.
    _postmaster_pid(pgdata, pid=os.getpid(), started=started - 600)
    assert _verified_url(pgdata, "kb", None) is None

    # A postmaster that is gone (a crash left its file): its pid names no live process.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    _postmaster_pid(pgdata, pid=child.pid, started=started)
    _record_verified(pgdata, "kb", None)
    assert _verified_url(pgdata, "kb", None) is None

    # Starting up, or the record dropped after a failed connection: the full check runs.
    _postmaster_pid(pgdata, pid=os.getpid(), started=started, status="starting")
    assert _verified_url(pgdata, "kb", None) is None
    _postmaster_pid(pgdata, pid=os.getpid(), started=started)
    _record_verified(pgdata, "kb", None)
    assert _verified_url(pgdata, "kb", None) is not None
    forget_verified(pgdata)
    assert not (pgdata / VERIFIED_MARKER).exists()
    assert _verified_url(pgdata, "kb", None) is None


def test_recorded_check_keeps_every_database_of_one_postmaster(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    _postmaster_pid(pgdata, pid=os.getpid(), started=_this_process_started())
    _record_verified(pgdata, "kb", None)
    _record_verified(pgdata, "kb_other", None)
    assert json.loads((pgdata / VERIFIED_MARKER).read_text())["databases"] == ["kb", "kb_other"]
    assert _verified_url(pgdata, "kb", None) and _verified_url(pgdata, "kb_other", None)
    # A new postmaster starts a new record.
    _postmaster_pid(pgdata, pid=os.getpid(), started=_this_process_started(), port=5433)
    _record_verified(pgdata, "kb", None)
    assert json.loads((pgdata / VERIFIED_MARKER).read_text())["databases"] == ["kb"]


def test_corrupt_record_or_pid_file_falls_back(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    _postmaster_pid(pgdata, pid=os.getpid(), started=_this_process_started())
    (pgdata / VERIFIED_MARKER).write_text("{not json")
    assert _verified_url(pgdata, "kb", None) is None
    _record_verified(pgdata, "kb", None)  # a corrupt record is replaced, not an error
    assert _verified_url(pgdata, "kb", None) is not None
    (pgdata / "postmaster.pid").write_text("12\n")
    assert _verified_url(pgdata, "kb", None) is None


# -- the schema's one-read check ------------------------------------------------------------------


def test_schema_check_sends_every_difference_to_the_migration_runner(kb: KnowledgeBase, database_url: str) -> None:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        assert schema_is_current(conn)
        conn.execute(
            psycopg.sql.SQL(queries["test_drop_publication"]).format(
                publication=psycopg.sql.Identifier("kb_publication")
            )
        )
        conn.commit()
        assert not schema_is_current(conn)
    # Opening kb again repairs it through the full runner.
    KnowledgeBase.open(kb.settings).close()
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        assert schema_is_current(conn)
        assert conn.execute(queries["test_count_publications"], {"name": "kb_publication"}).fetchone()["n"] == 1
        # An edited migration: the quick check does not vouch for it, and opening says so.
        conn.execute(queries["test_edit_first_migration_checksum"])
        conn.commit()
        assert not schema_is_current(conn)
    with pytest.raises(MigrationError, match="changed after it was applied"):
        KnowledgeBase.open(kb.settings)


def test_schema_check_on_an_empty_database_is_false(pg_server: str) -> None:
    from support.database import run_admin, with_database

    run_admin(pg_server, "drop_database", database="kb_t_empty")
    run_admin(pg_server, "create_database", database="kb_t_empty")
    try:
        with psycopg.connect(with_database(pg_server, "kb_t_empty"), row_factory=psycopg.rows.dict_row) as conn:
            assert not schema_is_current(conn)
    finally:
        run_admin(pg_server, "drop_database", database="kb_t_empty")


# -- the schema check's connection, kept for the command's own work ------------------------------


def _count_sessions(database_url: str, application: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute(queries["test_count_application_sessions"], {"application": application}).fetchone()[0]


def _sessions(database_url: str, application: str, expected: int | None = None) -> int:
    """The server's sessions of ``application``, once they number ``expected`` (waiting up to 30 s:
    a closed connection's backend stays in pg_stat_activity until it has exited, which a loaded
    machine delays), or at once when no number is expected."""
    if expected is not None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _count_sessions(database_url, application) != expected:
            time.sleep(0.05)
    return _count_sessions(database_url, application)


def test_a_parked_connection_is_the_next_one_only_while_fresh_and_idle(database_url: str, monkeypatch) -> None:
    url = f"{database_url} application_name=kb_parked"
    first = database.connect(url)
    database.park(first, url)
    assert database.connect(url) is first  # handed over once
    second = database.connect(url)
    assert second is not first and not first.closed
    first.close()

    second.execute(queries["test_open_a_transaction"])  # a transaction open: not idle, so closed rather than kept
    database.park(second, url)
    assert second.closed and _sessions(database_url, "kb_parked", 0) == 0

    third = database.connect(url)
    database.park(third, url)
    monkeypatch.setattr(database, "PARKED_SECONDS", 0.0)
    fourth = database.connect(url)  # kept too long: closed, a new session instead
    assert fourth is not third and third.closed
    fourth.close()

    fifth = database.connect(url)
    database.park(fifth, url)
    database.close_pools()  # at exit, with the pools
    assert fifth.closed and _sessions(database_url, "kb_parked", 0) == 0


def test_opening_for_a_quick_command_keeps_the_schema_checks_connection(settings, database_url: str) -> None:
    url = f"{database_url} application_name=kb_reused"
    quick = settings.model_copy(update={"database_url": url})
    KnowledgeBase.open(quick)
    assert _sessions(database_url, "kb_reused", 0) == 0  # closed after the check
    kb = KnowledgeBase.open(quick, reuse_connection=True)
    assert _sessions(database_url, "kb_reused", 1) == 1
    kb.create_workspace(1)
    assert kb.workspaces()[0]["id"] == 1
    database.close_pools()
    assert _sessions(database_url, "kb_reused", 0) == 0


# -- the command line -----------------------------------------------------------------------------


def test_quick_commands_leave_the_collector_running(kb: KnowledgeBase, kb_env: dict[str, str], monkeypatch) -> None:
    kb.create_workspace(1)
    with kb.transaction(1, "one note", "alice") as tx:
        tx.write("/documents/Note.md", "# Note\n\nbody\n")
    for key, value in kb_env.items():
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    for args in (["log", "-w", "1"], ["read", "/documents/Note.md", "-w", "1"], ["status", "-w", "1"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        assert gc.isenabled(), args
    monkeypatch.setenv("KB_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")  # fails in open
    result = runner.invoke(main, ["log", "-w", "1"])
    assert result.exit_code == 1 and gc.isenabled()


def test_a_closed_pipe_ends_the_command_quietly(kb: KnowledgeBase, kb_env: dict[str, str]) -> None:
    """``kb log | head -1``: once the reader is gone, kb stops without an error message (before the
    fix: ``kb: unexpected error: BrokenPipeError``)."""
    kb.create_workspace(1)
    for i in range(3):
        with kb.transaction(1, f"note {i}", "alice") as tx:
            tx.write(f"/documents/Note {i}.md", f"# Note {i}\n")
    for command in (["log", "-w", "1"], ["status", "-w", "1"], ["read", "/documents/Note 1.md", "-w", "1"]):
        process = subprocess.Popen(
            [sys.executable, "-m", "kb.adapters.cli", *command],
            env=kb_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        process.stdout.close()  # the reader is gone before kb writes its first line
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == 141, (command, stderr)
        assert stderr == "", command
    assert run_cli(kb_env, "log", "-w", "1").stdout.startswith(kb.head(1))


# -- commands loaded from their modules when asked for --------------------------------------------


def test_the_table_of_command_modules_is_every_command() -> None:
    import importlib
    import pkgutil

    import kb.adapters.cli
    from kb.adapters.cli.main import COMMAND_MODULES

    listed = {}
    for found in pkgutil.iter_modules(kb.adapters.cli.__path__):
        if found.name == "__main__":  # runs the command line
            continue
        module = importlib.import_module(f"kb.adapters.cli.{found.name}")
        if hasattr(module, "COMMANDS"):
            listed[found.name] = tuple(command.name for command in module.COMMANDS)
    assert listed == COMMAND_MODULES


def test_a_command_loads_its_own_module_and_help_or_a_misspelling_all() -> None:
    probe = (
        "import sys\nfrom kb.adapters.cli.main import main\n"
        "try:\n    main(sys.argv[1:], standalone_mode=False)\nexcept Exception as exc:\n    print(exc.format_message())\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('kb.adapters.cli.')))"
    )

    def loaded(*args: str) -> tuple[str, list[str]]:
        result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True)
        *shown, modules = result.stdout.strip().splitlines()
        return "\n".join(shown), json.loads(modules.replace("'", '"'))

    assert loaded("log", "--help")[1] == ["history", "main", "options", "session", "terminal"]
    shown, modules = loaded("--help")
    assert "  workspaces " in shown and "  log " in shown and "  token " in shown and len(modules) == 20
    shown, modules = loaded("stauts")
    assert "Did you mean 'status'?" in shown and len(modules) == 20
