"""The JSON form of kb's results, for every interface that serializes them (``kb serve``, MCP)."""

from __future__ import annotations

import dataclasses
from typing import Any


def json_form(value: Any) -> Any:
    """``value`` as JSON-ready data: a result's own ``as_json()`` where it defines one, else a
    dataclass's public fields; tuples and sets become lists, datetimes ISO strings, timedeltas
    seconds (float). Other values are returned as they are."""
    if callable(getattr(value, "as_json", None)):
        return value.as_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: json_form(getattr(value, f.name)) for f in dataclasses.fields(value) if not f.name.startswith("_")
        }
    if isinstance(value, dict):
        return {str(k): json_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_form(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "total_seconds"):
        return value.total_seconds()
    return value
