"""``kb artifact save|revise|show|list|delete`` (design §11): the CLI of ``kb.workspace.artifacts.Artifacts``.

Registered by ``kb/adapters/cli/main.py``; errors (``KbError``) become one-line messages there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kb.adapters.cli import session
from kb.adapters.cli.counts import counted
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown, shown_on_terminal

file_option = click.option(
    "--file",
    "files",
    multiple=True,
    metavar="ROLE=PATH",
    help="Attach a file under a role name (repeatable), e.g. --file data.csv=./out/data.csv",
)


def _artifacts(workspace: int):
    """The workspace's artifacts, of the KnowledgeBase this command opens (and closes)."""
    return session.open_kb().artifacts(workspace)


def _read_files(specs: tuple[str, ...]) -> dict[str, bytes]:
    files = {}
    for spec in specs:
        role, sep, path = spec.partition("=")
        if not sep or not role or not path:
            raise click.BadParameter(f"{spec!r}: give ROLE=PATH, e.g. data.csv=./data.csv", param_hint="--file")
        try:
            files[role] = Path(path).read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="--file") from None
    return files


def _markdown(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise click.BadParameter(f"{source}: {exc.strerror}", param_hint="MARKDOWN") from None


def _describe(artifact) -> None:
    click.echo(f"artifact {artifact.id}: {shown(artifact.path)}")
    click.echo(
        f"  title: {shown(artifact.title)}   format: {shown(artifact.format)}   generation: {artifact.generation}"
    )
    if artifact.revision:
        click.echo(f"  revision: {artifact.revision}")
    for f in artifact.files:
        click.echo(f"  file {shown(f.role)}: {f.size} bytes, sha256 {f.sha256}")


@click.group()
def artifact() -> None:
    """Generated deliverables (reports, decks, CSVs) saved as ARTIFACT documents with attached
    files and optimistic revisions (design §11).

    Example: kb artifact save report.md --title "Q3 report" --file data.csv=./data.csv -w 1
    """


@artifact.command()
@click.argument("markdown", metavar="MARKDOWN")
@click.option("--title", required=True, help="Title; the file is /documents/Artifacts/<title>.md.")
@file_option
@click.option("--format", "fmt", default="markdown", show_default=True, help="Format label, e.g. html, csv.")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help='Revision message (default: artifact: save "<title>").')
@workspace_option()
def save(
    markdown: str, title: str, files: tuple[str, ...], fmt: str, author: str | None, message: str | None, workspace: int
) -> None:
    """Save a new artifact from a markdown file (MARKDOWN, or - for stdin) as one revision.

    Example: kb artifact save report.md --title "Q3 report" --file chart.png=./chart.png -w 1
    """
    saved = _artifacts(workspace).save(title, _markdown(markdown), _read_files(files), fmt, author, message)
    _describe(saved)


@artifact.command()
@click.argument("artifact_id", type=int)
@click.argument("markdown_file", metavar="[MARKDOWN]", required=False)
@click.option("--generation", "-g", type=int, required=True, help="The generation you read (kb artifact show).")
@click.option(
    "--markdown",
    "markdown",
    metavar="MARKDOWN",
    help="The new markdown file, as an option (the same as the MARKDOWN argument).",
)
@file_option
@click.option("--no-files", is_flag=True, help="Remove every attached file.")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help="Revision message.")
@workspace_option()
def revise(
    artifact_id: int,
    markdown_file: str | None,
    generation: int,
    markdown: str | None,
    files: tuple[str, ...],
    no_files: bool,
    author: str | None,
    message: str | None,
    workspace: int,
) -> None:
    """Revise an artifact from a new markdown file (MARKDOWN, or - for stdin; omitted keeps the
    markdown), naming the generation you read; a stale one is refused (exit 1) with the current
    generation. --file replaces the whole set of files.

    Example: kb artifact revise 12 --generation 3 report.md -w 1
    """
    if markdown_file is not None and markdown is not None and markdown_file != markdown:
        raise click.UsageError("give the markdown file once: as MARKDOWN or as --markdown")
    markdown = markdown_file if markdown_file is not None else markdown
    if no_files and files:
        raise click.UsageError("give --file or --no-files, not both")
    new_files = {} if no_files else (_read_files(files) if files else None)
    data = None if markdown is None else _markdown(markdown)
    if data is None and new_files is None:
        raise click.UsageError("nothing to revise: give a MARKDOWN file, --file or --no-files")
    _describe(_artifacts(workspace).revise(artifact_id, generation, data, new_files, author, message))


@artifact.command()
@click.argument("artifact_id", type=int)
@click.option("--file", "role", help="Write this attached file's bytes to stdout (or --output).")
@click.option("--markdown", "show_markdown", is_flag=True, help="Print the markdown.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
@workspace_option()
def show(artifact_id: int, role: str | None, show_markdown: bool, output: Path | None, workspace: int) -> None:
    """Show an artifact's metadata, its markdown (--markdown) or one attached file (--file ROLE).

    Example: kb artifact show 12 --file data.csv -o data.csv -w 1
    """
    artifacts = _artifacts(workspace)
    if role is None and not show_markdown:
        _describe(artifacts.get(artifact_id))
        return
    data = artifacts.read_file(artifact_id, role) if role else artifacts.read_markdown(artifact_id)
    if output:
        output.write_bytes(data)
        click.echo(f"wrote {len(data)} bytes to {output}")
    elif sys.stdout.isatty():  # the artifact's own bytes: as they are into a pipe, escaped on a terminal
        click.echo(shown_on_terminal(data.decode("utf-8", errors="replace")), nl=False)
    else:
        sys.stdout.buffer.write(data)


@artifact.command("list")
@workspace_option()
def list_(workspace: int) -> None:
    """List a workspace's artifacts: id, generation, format, files, path.

    Example: kb artifact list -w 1
    """
    for a in _artifacts(workspace).list():
        click.echo(
            f"{a.id}\tgeneration {a.generation}\t{shown(a.format)}\t{counted(len(a.files), 'file')}\t{shown(a.path)}"
        )


@artifact.command()
@click.argument("artifact_id", type=int)
@click.option("--generation", "-g", type=int, help="Refuse unless the artifact is still at this generation.")
@click.option("--author", help="Author of the revision (default: your user name).")
@workspace_option()
def delete(artifact_id: int, generation: int | None, author: str | None, workspace: int) -> None:
    """Delete an artifact: its markdown is removed in one revision (history keeps it), its rows
    go and its files are purged.

    Example: kb artifact delete 12 -w 1
    """
    revision = _artifacts(workspace).delete(artifact_id, generation, author)
    click.echo(f"deleted artifact {artifact_id}" + (f" in revision {revision.id}" if revision else ""))


COMMANDS = [artifact]
