"""``kb remote add|show|remove|push`` (design §13): the CLI of ``kb.workspace.remotes.Remote``.

Registered by ``kb/adapters/cli/main.py``; errors (``KbError``) become one-line messages there.
"""

from __future__ import annotations

import click

from kb.adapters.cli import session
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown


def _remote(workspace: int):
    """The workspace's remote, of the KnowledgeBase this command opens (and closes)."""
    return session.open_kb().remote(workspace)


def _describe(status) -> None:
    click.echo(f"remote:   {status.url}")
    click.echo(f"branch:   {status.branch}")
    click.echo(
        f"pushed:   {status.last_pushed_revision or 'nothing yet'}"
        + (f" at {status.last_pushed_at:%Y-%m-%d %H:%M:%S %Z}" if status.last_pushed_at else "")
    )
    click.echo(f"head:     {status.head or '(empty workspace)'}{' (remote is behind)' if status.behind else ''}")
    if status.last_push_error:
        click.echo(f"error:    {shown(status.last_push_error)} ({status.push_failures} failed attempts)")


@click.group()
def remote() -> None:
    """A push-only git remote per workspace: every revision is pushed, fast-forward only, by a
    worker job (design §13). Credentials: KB_REMOTE_USERNAME/KB_REMOTE_PASSWORD or a git-credentials
    file named by KB_REMOTE_CREDENTIALS_FILE; never in the URL.

    Example: kb remote add https://forge.example/team/notes.git --branch main -w 1
    """


@remote.command()
@click.argument("url")
@click.option("--branch", default="main", show_default=True, help="Remote branch to push to.")
@workspace_option()
def add(url: str, branch: str, workspace: int) -> None:
    """Configure the workspace's remote (its branch must be absent or an ancestor of HEAD) and
    queue a first push.

    Example: kb remote add git://127.0.0.1/notes.git -w 1
    """
    _describe(_remote(workspace).add(url, branch))


@remote.command()
@workspace_option()
def show(workspace: int) -> None:
    """Show the remote, what was pushed last, and the last push error.

    Example: kb remote show -w 1
    """
    _describe(_remote(workspace).status())


@remote.command("remove")
@workspace_option()
def remove(workspace: int) -> None:
    """Forget the workspace's remote (nothing is deleted on the remote).

    Example: kb remote remove -w 1
    """
    _remote(workspace).remove()
    click.echo(f"workspace {workspace}: remote removed")


@remote.command()
@click.option("--now", is_flag=True, help="Push in this process and wait, instead of queueing a job.")
@workspace_option()
def push(now: bool, workspace: int) -> None:
    """Push HEAD to the remote: queue a push job (default) or push now (--now).

    Example: kb remote push --now -w 1
    """
    target = _remote(workspace)
    if not now:
        job = target.defer_push()
        click.echo(f"push job {job} queued" if job else "a push job is already waiting")
        return
    result = target.push()
    click.echo(f"pushed {result.revision}" if result.pushed else f"remote already at {result.revision}")


COMMANDS = [remote]
