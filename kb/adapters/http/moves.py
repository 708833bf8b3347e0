"""``kb serve``'s node-to-node routes of a workspace move (design §15, ``kb.workspace.moves``).

- ``GET  /v1/internal/workspaces/{ws}/moves/{move}/archive`` — on the home node: the archive of the
  repository and artifact files (a tar stream) for an open move window.
- ``POST /v1/internal/workspaces/{ws}/moves/{move}/receive`` ``{"source_url", "force"}`` — on the
  target node: pull that archive from ``source_url``, verify and place it; answers the verified
  head, identity and sizes.
- ``POST /v1/internal/workspaces/{ws}/moves/{move}/retire`` — on the old home after the flip:
  rename its copy aside; ``…/discard`` — on the target after an abort: the same for its copy.

Each needs an API token with admin scope on the workspace (design §16): the operator's
``KB_TOKEN``, which ``kb workspace move`` sends to the target and the target passes on to the home
node. Each refuses unless Postgres says this node plays that part in that move (the window row and the
home node), so a stray call cannot hand out or replace an authoritative repository. They are not
forwarded to the home node: they name the node they run on.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask

from kb.adapters.http.auth import request_token, require
from kb.adapters.http.json_bodies import JsonRoute

if TYPE_CHECKING:
    from kb.adapters.http.server import Service


class ReceiveBody(BaseModel):
    """``POST …/receive``: where the home node's ``kb serve`` answers, and whether open turns
    there may be left behind."""

    source_url: str
    force: bool = False


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def moves_router(service: Service) -> APIRouter:
    """The node-to-node routes of a move (see the module docstring)."""
    router = APIRouter(
        prefix="/v1/internal/workspaces/{workspace_id}/moves/{move_id}",
        tags=["moves"],
        dependencies=[Depends(require("admin"))],
        route_class=JsonRoute,
    )

    @router.get("/archive")
    def archive(workspace_id: int, move_id: str, force: bool = False) -> FileResponse:
        """The home node's archive of the workspace for this move (tar: git bundle + artifact files)."""
        path = str(service.kb().export_workspace(workspace_id, move_id, force=force))
        return FileResponse(path, media_type="application/x-tar", background=BackgroundTask(_remove, path))

    @router.post("/receive")
    def receive(workspace_id: int, move_id: str, body: ReceiveBody, request: Request) -> dict:
        """Pull, verify and place the copy on this (target) node; the caller's token goes on to the
        home node's archive route."""
        token = request_token(request)
        secret = request.headers.get("authorization", "").removeprefix("Bearer ").strip() if token else None
        received = service.kb().receive_workspace(
            workspace_id, move_id, body.source_url, force=body.force, token=secret or None
        )
        return received.__dict__

    @router.post("/retire")
    def retire(workspace_id: int, move_id: str) -> dict:
        """Rename this (old home) node's copy aside after the flip."""
        return {"renamed": service.kb().retire_workspace_copy(workspace_id, move_id)}

    @router.post("/discard")
    def discard(workspace_id: int, move_id: str) -> dict:
        """Rename this (target) node's copy aside after an abort."""
        return {"renamed": service.kb().retire_workspace_copy(workspace_id, move_id, aborted=True)}

    return router
