"""The optional Redis write lock (design §4, ``KB_LOCK_BACKEND=redis``).

Token-owned: ``SET key token NX PX ttl`` acquires, a compare-and-delete script releases only
the holder's own token, the TTL (``KB_LOCK_TTL`` seconds) frees a crashed holder's lock, the wait
is bounded by ``KB_LOCK_TIMEOUT`` (then LockTimeout), and an unreachable Redis raises
LockUnavailable before anything is written (fail if down). Never needed for correctness.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator

from kb.errors import LockTimeout, LockUnavailable
from kb.settings import Settings

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""


def redacted_redis_url(url: str) -> str:
    """``url`` (``KB_REDIS_URL``) with any password replaced by ``***``, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def redis_address(url: str) -> str | None:
    """``host:port`` of ``url`` as redis-py names the server in its connection errors (None:
    a Unix socket URL, or no host)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port or 6379
    except ValueError:
        return None
    return f"{parts.hostname}:{port}" if parts.hostname and parts.scheme in ("redis", "rediss") else None


class RedisLock:
    """Per-workspace lock keyed ``kb:write_lock:{workspace_id}`` on ``KB_REDIS_URL``."""

    def __init__(self, settings: Settings) -> None:
        import redis

        self._redis = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self._errors = (redis.ConnectionError, redis.TimeoutError)
        self.url = redacted_redis_url(settings.redis_url)  # messages never carry its password
        self.timeout = settings.lock_timeout
        self.ttl_ms = int(settings.lock_ttl * 1000)

    @staticmethod
    def key(workspace_id: int) -> str:
        """The Redis key of a workspace's write lock."""
        return f"kb:write_lock:{workspace_id}"

    @contextlib.contextmanager
    def hold(self, workspace_id: int) -> Iterator[str]:
        """Acquire (waiting at most the timeout), yield the token, release only our own token.

        Raises LockTimeout when another holder keeps it past the wait, LockUnavailable when Redis
        is down.
        """
        key, token = self.key(workspace_id), secrets.token_hex(16)
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        try:
            while not self._redis.set(key, token, nx=True, px=self.ttl_ms):
                if time.monotonic() >= deadline:
                    raise LockTimeout(workspace_id, self.timeout, backend="redis")
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        except self._errors as exc:
            raise LockUnavailable(
                f"Redis at {self.url} is unreachable ({exc}); no write was made. "
                "Start Redis or set KB_LOCK_BACKEND=postgres."
            ) from exc
        try:
            yield token
        finally:
            try:
                self._redis.eval(_RELEASE, 1, key, token)
            except self._errors:
                pass  # the TTL frees it
