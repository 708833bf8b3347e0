"""Loopback ports for the servers a test starts (kb serve, git daemon, PgBouncer, zero-cache, …)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (the OS picks it; another process
    may still take it before the caller binds, which a loopback test accepts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Relay:
    """A TCP relay on a free loopback port to ``host:port`` (e.g. Postgres), in threads of this
    process: ``close()`` makes the target unreachable through it at once (its listener and every
    relayed connection closed), as a database that went away."""

    def __init__(self, host: str, port: int) -> None:
        import threading

        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def reopen(self) -> None:
        """Relay again on the same port after ``close()`` (the database is back)."""
        import threading

        listener = socket.create_server(("127.0.0.1", self.port))
        with self.lock:
            self.listener, self.sockets, self.closed = listener, [], False
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                # a connection accepted while close() ran is cut too: it would outlive the outage
                # (the closing loop had not seen it), and a client kept talking through it
                if self.closed or listener is not self.listener:
                    for s in (client, upstream):
                        s.close()
                    continue
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop relaying: no new connection, every open one cut."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            self.closed = True
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
