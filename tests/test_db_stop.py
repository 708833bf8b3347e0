"""design §13: kb's connections name their process (``application_name``), and psycopg's warnings
stay off a command's stderr."""

from __future__ import annotations

import signal

from support.commands import halted_cli, run_cli
from support.named_queries import queries

from kb.db import database


def test_psycopg_warnings_stay_off_a_commands_stderr(kb, kb_env, settings, tmp_path):
    """A command whose pooled connections ended under it (the server restarted, a Ctrl-C in
    mid-statement) printed psycopg's and psycopg_pool's warnings ("error ignored terminating
    <psycopg.Pipeline [BAD]>", "discarding closed connection …") on stderr beside its own
    outcome. kb reports the outcome; the pool's bookkeeping is not the user's."""
    kb.create_workspace(1)
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.md").write_text("# A\n\nfirst\n")
    run_cli(kb_env, "import", str(source), "--workspace", "1")
    (source / "a.md").write_text("# A\n\nsecond\n")
    # halted just before Postgres commits, its pooled sessions open
    with halted_cli(kb_env, "before_pg_commit", "import", str(source), "--workspace", "1") as importer:
        with database.connect(settings.database_url, autocommit=True) as admin:
            ended = admin.execute(queries["test_terminate_application"], {"name": f"kb import pid {importer.pid}"})
            assert ended.fetchone()["terminated"] >= 1  # its sessions carry its name
        importer.send_signal(signal.SIGCONT)
        _, err = importer.communicate(timeout=300)
    assert "psycopg" not in err and "connection:" not in err, err
    assert err == "" or err.startswith("kb: ") and err.count("\n") == 1, err
