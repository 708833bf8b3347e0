"""The API routes of ``kb serve``'s app as its checks at start-up see them (``create_app``:
every route has a token check, every route taking a body reads it strictly).

FastAPI keeps an included router as one entry of ``app.routes`` (its routes inside, their paths
without the include's prefix): a check reading ``app.routes`` alone saw ``/health`` and
``/ready`` and passed whatever the routers held.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.routing import APIRoute


def api_routes(app) -> Iterator[tuple[str, set[str], APIRoute]]:
    """``(path as served, methods, route)`` of every FastAPI route of ``app``, those of included
    routers (at any depth) too."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # a FastAPI that copies an included router's routes into app.routes
        for route in app.routes:
            if isinstance(route, APIRoute):
                yield route.path, set(route.methods), route
        return
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute):
            yield context.path or route.path, set(context.methods or route.methods), route
