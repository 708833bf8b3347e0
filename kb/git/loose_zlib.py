"""The zlib stream of a big loose tree, compressed in segments so a revision recompresses only the
segments it changed (design §2.1: O(changed entries) writes).

A loose object is one zlib stream of ``<type> <size>\\0<text>``. Every revision of a big folder
writes its tree again, and compressing 4,612 entries' text at git's default level cost ~2 ms per
revision. A deflate stream may be a sequence of blocks, each made by its own compressor and ended
with a full flush (byte-aligned, no reference to earlier data): pigz builds its streams this way.
Here the text is cut at content-defined points (after a name's NUL when the object id that follows
starts with a zero byte: about every 10 kB, and the same points in every revision away from a
change), each segment is compressed once and remembered by its bytes, and a revision's stream is
the zlib header, the header segment, the segments (most of them remembered), an empty final block
and the Adler-32 of the whole: any zlib reader (git, dulwich) reads it as it reads git's own.
"""

from __future__ import annotations

import collections
import threading
import zlib

MIN_BYTES = 32768
"""Texts shorter than this are compressed whole (as dulwich does)."""
CACHE_SEGMENTS = 256
"""Compressed segments a SegmentedCompressor remembers by default (most recently used; ~10 kB of
text each)."""
PROCESS_SEGMENTS = 1024
"""Compressed segments remembered per process and zlib level, shared by every repository
(:func:`shared`): ~17 MB of text and compressed bytes at most. One compressor per repository
remembered up to CACHE_SEGMENTS each (about one new segment per revision of a big folder: ~4 MB
after a few hundred revisions), and a process keeps every workspace's repository it wrote, so a
server writing big folders in many workspaces grew by that much per workspace, without bound."""
_CUT = b"\0\0"
_FLUSHED = b"\0\0\xff\xff"
"""How a full flush ends a segment's blocks (an empty stored block)."""


_shared: dict[int, SegmentedCompressor] = {}
_shared_lock = threading.Lock()


def shared(level: int) -> SegmentedCompressor:
    """The process's compressor of ``level`` (remembering PROCESS_SEGMENTS segments), shared by
    every repository: a segment's compressed bytes depend on its text and the level only, so any
    repository may use another's (design §2.1)."""
    with _shared_lock:
        compressor = _shared.get(level)
        if compressor is None:
            compressor = _shared[level] = SegmentedCompressor(level, PROCESS_SEGMENTS)
        return compressor


def reset() -> None:
    """Forget the shared compressors (the next :func:`shared` makes new ones, with the current
    PROCESS_SEGMENTS)."""
    with _shared_lock:
        _shared.clear()


def _deflate(data: bytes, level: int) -> bytes:
    """Raw deflate blocks of ``data`` ending in a full flush: byte-aligned, not final, and with no
    reference to any data before them."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


def segments(text: bytes) -> list[bytes]:
    """``text`` cut after each NUL that a NUL follows (content-defined: a change moves no cut
    away from it); their concatenation is ``text``."""
    parts = []
    position = 0
    while True:
        cut = text.find(_CUT, position)
        if cut < 0:
            parts.append(text[position:])
            return parts
        parts.append(text[position : cut + 1])
        position = cut + 1


class SegmentedCompressor:
    """Loose-object streams of big texts from remembered compressed segments (thread-safe)."""

    def __init__(self, level: int, size: int = CACHE_SEGMENTS) -> None:
        self.level = level
        self._size = size
        self._segments: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()
        self._texts: dict[bytes, bytes] = {}  # the same segments, compressed -> text
        self._lock = threading.Lock()
        self._zlib_header = zlib.compressobj(level).flush()[:2]
        self._final = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS).flush(zlib.Z_FINISH)

    def compress(self, header: bytes, text: bytes) -> bytes:
        """The zlib stream of ``header + text`` (``header``: ``b"tree 123\\0"``), decompressing to
        exactly those bytes. Cost: O(len(text)) in C (cutting, hashing, Adler-32) plus compressing
        the segments not remembered."""
        parts = [self._zlib_header, _deflate(header, self.level)]
        fresh = []
        with self._lock:
            for segment in segments(text):
                packed = self._segments.get(segment)
                if packed is None:
                    fresh.append((len(parts), segment))
                else:
                    self._segments.move_to_end(segment)
                parts.append(packed or b"")
        for at, segment in fresh:
            parts[at] = _deflate(segment, self.level)
        with self._lock:
            for at, segment in fresh:
                self._segments[segment] = parts[at]
                self._texts[parts[at]] = segment
            while len(self._segments) > self._size:
                self._texts.pop(self._segments.popitem(last=False)[1], None)
        checksum = zlib.adler32(text, zlib.adler32(header))
        parts += [self._final, checksum.to_bytes(4, "big")]
        return b"".join(parts)

    def decompress(self, stream: bytes, max_size: int) -> bytes | None:
        """The bytes the zlib ``stream`` holds when it is made of segments as :meth:`compress`
        makes them at this level (another process's revision of a big tree shares most of its
        segments with this one's): remembered segments are not inflated again, the others are
        inflated one by one. None when the stream is not of that shape, longer than ``max_size``
        or its Adler-32 does not match (the caller inflates it whole). The caller still checks
        the object id: a flush marker inside a segment's compressed bytes may split it wrongly."""
        if not stream.startswith(self._zlib_header) or len(stream) < 2 + len(self._final) + 4:
            return None
        end = len(stream) - 4 - len(self._final)
        if stream[end : end + len(self._final)] != self._final:
            return None
        parts = []
        size = 0
        position = 2
        try:
            while position < end:
                cut = stream.find(_FLUSHED, position, end)
                if cut < 0:
                    return None
                piece = stream[position : cut + 4]
                with self._lock:
                    text = self._texts.get(piece)
                if text is None:
                    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                    text = inflater.decompress(piece, max_size + 1 - size)
                    if inflater.unconsumed_tail or inflater.eof:
                        return None
                parts.append(text)
                size += len(text)
                if size > max_size:
                    return None
                position = cut + 4
        except zlib.error:
            return None
        text = b"".join(parts)
        if zlib.adler32(text) != int.from_bytes(stream[-4:], "big"):
            return None
        return text
