"""``kb token create|list|revoke`` (design §16): the API tokens ``kb serve`` and MCP over HTTP
require (``kb.db.tokens.TokenStore``).

Registered by ``kb/adapters/cli/main.py``; errors (``KbError``) become one-line messages there.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import click

from kb.adapters.cli import session
from kb.adapters.cli.terminal import shown
from kb.errors import InvalidInput
from kb.paths import MAX_WORKSPACE_ID

_DURATION = re.compile(r"(\d{1,6})([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_lifetime(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w`` → a timedelta. Raises InvalidInput for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise InvalidInput(f"--expires {text!r} is not a positive number and a unit m, h, d or w (e.g. 30d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _workspaces(token) -> str:
    return "all" if token.workspace_ids is None else ",".join(str(i) for i in token.workspace_ids)


def _workspaces_phrase(token) -> str:
    """What a token reaches, in a sentence: "all workspaces", "workspace 2" or "workspaces 2,3"."""
    if token.workspace_ids is None:
        return "all workspaces"
    return f"workspace{'' if len(token.workspace_ids) == 1 else 's'} {_workspaces(token)}"


@click.group()
def token() -> None:
    """API tokens for kb serve and MCP over HTTP (design §16): every route but /health and /ready
    needs 'Authorization: Bearer <token>'. Scopes: read (search, read, log, status, citations),
    write (read + turns and commits), admin (write + administration). Postgres keeps only each
    token's SHA-256; the token is printed once, by create.

    Example: kb token create --name support-bot --scope read -w 2
    """


@token.command()
@click.option("--name", required=True, help="Who uses it (letters, digits, . _ -); recorded as committer.")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), required=True, help="read ⊂ write ⊂ admin.")
@click.option(
    "--workspace",
    "-w",
    "workspaces",
    multiple=True,
    type=click.IntRange(min=1, max=MAX_WORKSPACE_ID),
    help="A workspace it reaches (repeat for several).",
)
@click.option("--all-workspaces", is_flag=True, help="Reach every workspace, also ones created later.")
@click.option("--expires", help="Lifetime, e.g. 30d, 12h, 90m, 2w (default: until revoked).")
def create(name: str, scope: str, workspaces: tuple[int, ...], all_workspaces: bool, expires: str | None) -> None:
    """Create a token and print it (once: only its SHA-256 is kept).

    Example: kb token create --name support-bot --scope write -w 2 -w 3 --expires 30d
    """
    if bool(workspaces) == all_workspaces:
        raise InvalidInput(
            "name the workspaces the token reaches (--workspace N, repeatable) or pass --all-workspaces",
        )
    lifetime = None if expires is None else parse_lifetime(expires)
    kb = session.open_kb(create=True)  # a deployment's first step may be its first token
    created, secret = kb.tokens().create(
        name,
        scope,  # type: ignore[arg-type]
        None if all_workspaces else workspaces,
        lifetime,
    )
    click.echo(secret)
    expiry = "never expires" if created.expires_at is None else f"expires {_utc(created.expires_at)}"
    click.echo(
        f"token {created.id} {created.name!r}: {created.scope} on {_workspaces_phrase(created)}, {expiry}. "
        "It is shown only now; send it as 'Authorization: Bearer <token>' (the CLI: KB_TOKEN).",
        err=True,
    )
    absent = sorted(set(workspaces) - {row["id"] for row in kb.workspaces()}) if not all_workspaces else []
    if absent:  # a typo, or a workspace still to be created: say so, the token stands either way
        click.echo(
            f"note: no workspace {', '.join(map(str, absent))} exists yet; the token reaches "
            f"{'it' if len(absent) == 1 else 'them'} once created (kb import PATH --workspace N), "
            f"or revoke it (kb token revoke {created.name}) if that was a typo.",
            err=True,
        )


@token.command("list")
@click.option("--revoked", is_flag=True, help="Also the revoked tokens.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_tokens(revoked: bool, as_json: bool) -> None:
    """The tokens (never their secrets): id, name, scope, workspaces, created, and when each
    expires — EXPIRED for one past its lifetime, refused like a revoked one — or was revoked.

    Example: kb token list --revoked
    """
    for each in session.open_kb().tokens().list(include_revoked=revoked):
        if as_json:
            click.echo(json.dumps(each.as_json()))
            continue
        if each.revoked_at:
            state = f"revoked {_utc(each.revoked_at)}"
        elif each.expires_at is None:
            state = "no expiry"
        else:  # an expired token is refused as a revoked one is: said, not shown as live
            state = f"{'EXPIRED' if each.expired() else 'expires'} {_utc(each.expires_at)}"
        click.echo(
            f"{each.id:>5}  {shown(each.name):<24} {each.scope:<6} workspaces {_workspaces(each):<12} "
            f"created {_utc(each.created_at)}  {state}"
        )


@token.command()
@click.argument("token_ref", metavar="ID_OR_NAME")
def revoke(token_ref: str) -> None:
    """Revoke a token by id or name; the next request carrying it is refused (401).

    Example: kb token revoke support-bot
    """
    revoked = session.open_kb().tokens().revoke(token_ref)
    click.echo(f"revoked token {revoked.id} {revoked.name!r}")


def _utc(moment: datetime) -> str:
    """``2026-12-02 07:15 UTC``: a time as the pages show it, whatever the session's time zone."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


COMMANDS = [token]
