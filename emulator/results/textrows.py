"""Lines of text for the long tables (timeline.csv, the trace's events) written by one compiled loop,
byte for byte what Python's ``str`` and ``repr`` write.

    from emulator.results.textrows import INT, TEXT, RowText
    rows = RowText(["", ",", "\\r\\n"])                          # two columns, then the line's end
    values, kinds = np.array([[0, 7]]), np.array([[TEXT, INT]], dtype=np.int8)
    rows.format(values, kinds, ["gpu"])                          # b"gpu,7\\r\\n"

A table is a matrix of int64 cells, one kind per cell: ``INT`` (``str`` of the int), ``TEXT`` (the
cell is an index into a list of strings) or ``d`` in 1..9, a float that is exactly ``k / 10**d``
for the cell's integer ``k`` (a time ``ns / 1e3``, a bucket's ``slot * bucket_ns / 1e9``, a
``round(x, 6)``). Python's ``repr`` of such a float is ``k``'s digits with the point ``d`` places
from the right, trailing zeros dropped (:func:`decimal_ok` says when: ``0``, or ``k < 10**15`` so
that no other decimal of at most 15 digits names the same double, and a value of at least 1e-4,
below which ``repr`` writes an exponent). A cell that is none of these is given as ``TEXT`` with
its Python-formatted string, so every row comes out right; the loop only saves the per-cell Python
calls (the reference run's timeline has 217,000 rows of 7 cells; formatting them in Python, a
string per cell and per line, took about 0.15 s of the run's 0.6 s of writing).
"""

from __future__ import annotations

import numpy as np
from numba import int64, njit, uint64

from emulator.engine import kernel_cache  # noqa: F401 - before any kernel: one cache stamp (its module doc)

INT = 0
TEXT = -1
MAX_DECIMALS = 9
_DECIMAL_LIMIT = 10**15  # at most 15 significant digits: the decimal is the only one that short for its double


def decimal_ok(k: np.ndarray, decimals: int) -> np.ndarray:
    """Per integer ``k >= 0`` (int64 array): whether ``repr(k / 10**decimals)`` is ``k``'s decimal
    form (positional, at least 1e-4, at most 15 digits) or ``0.0``."""
    return (k == 0) | ((k >= 10 ** max(decimals - 4, 0)) & (k < _DECIMAL_LIMIT))


def _blob(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of ``texts`` end to end, and the offsets (``len(texts) + 1``) of each."""
    data = [t.encode() for t in texts]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    return np.frombuffer(b"".join(data) or b"\0", dtype=np.uint8), offsets


@njit(cache=True, inline="always")
def _put_int(out, pos: int, v: int, digits) -> int:
    """``str(v)`` at ``out[pos:]``; returns the end. Digits right to left by unsigned divisions by
    a constant (multiplications: Python's signed floor division would cost twice as much)."""
    if v < 0:
        out[pos] = 45  # '-'
        pos += 1
    u = uint64(-v) if v < 0 else uint64(v)
    n = 0
    while True:
        q = u // uint64(10)
        digits[n] = 48 + (u - q * uint64(10))
        u = q
        n += 1
        if u == 0:
            break
    for i in range(n):
        out[pos + i] = digits[n - 1 - i]
    return pos + n


@njit(cache=True, inline="always")
def _put_decimal(out, pos: int, k: int, d: int, digits) -> int:
    """``repr(k / 10**d)`` for ``k`` where :func:`decimal_ok` holds: the ``d`` digits right of the
    point without their trailing zeros (one ``0`` if none is left)."""
    n = 0
    u = uint64(k)
    for _ in range(d):
        q = u // uint64(10)
        digit = u - q * uint64(10)
        u = q
        if n or digit:  # skip the trailing zeros
            digits[n] = 48 + digit
            n += 1
    pos = _put_int(out, pos, int64(u), digits[n:])
    out[pos] = 46  # '.'
    pos += 1
    if not n:
        out[pos] = 48
        return pos + 1
    for i in range(n):
        out[pos + i] = digits[n - 1 - i]
    return pos + n


@njit(cache=True)
def _format(values, kinds, pieces, piece_at, texts, text_at, sep, sep_len):
    """Rows of ``values`` (n x c) by cell kind; ``pieces[piece_at[j]:piece_at[j+1]]`` before column
    j (the last piece ends the row); rows joined by ``sep[:sep_len]``. One pass into a buffer of
    the longest possible rows (an int64 is at most 20 characters, a decimal 21), then cut."""
    n, c = values.shape
    longest = 24
    for t in range(len(text_at) - 1):
        longest = max(longest, text_at[t + 1] - text_at[t])
    out = np.empty(n * (piece_at[c] + sep_len + c * longest), dtype=np.uint8)
    digits = np.empty(48, dtype=np.uint8)
    pos = 0
    for i in range(n):
        if i:
            for b in range(sep_len):
                out[pos + b] = sep[b]
            pos += sep_len
        for j in range(c + 1):
            for b in range(piece_at[j], piece_at[j + 1]):
                out[pos] = pieces[b]
                pos += 1
            if j == c:
                break
            v = values[i, j]
            kind = kinds[i, j]
            if kind == -1:
                for b in range(text_at[v], text_at[v + 1]):
                    out[pos] = texts[b]
                    pos += 1
            elif kind == 0:
                pos = _put_int(out, pos, v, digits)
            else:
                pos = _put_decimal(out, pos, v, kind, digits)
    return out[:pos]


class RowText:
    """A row layout: the literal text around the cells (``len(kinds) + 1`` pieces: before each
    column, then the row's end) and rows joined by ``sep``."""

    def __init__(self, pieces: list[str], sep: str = ""):
        self.columns = len(pieces) - 1
        self._pieces = _blob(["".join(pieces)])[0], np.array(
            [0, *np.cumsum([len(p.encode()) for p in pieces])], dtype=np.int64)  # fmt: skip
        self._sep = np.frombuffer(sep.encode() or b"\0", dtype=np.uint8), len(sep.encode())

    def format(self, values: np.ndarray, kinds: np.ndarray, texts: list[str]) -> bytes:
        """The rows as UTF-8 bytes. ``values``, ``kinds``: int64 matrices (rows x columns); a
        ``TEXT`` cell's value indexes ``texts``."""
        return self.format_array(values, kinds, texts).tobytes()

    def format_array(self, values: np.ndarray, kinds: np.ndarray, texts: list[str]) -> np.ndarray:
        """:meth:`format`'s bytes as a uint8 array (a binary file writes it without a copy); the
        kinds are int8 (a byte per cell: the reference run's timeline has 1.5 million cells)."""
        if not len(values):
            return self.format_encoded(values, kinds, *_blob([]))
        return self.format_encoded(values, kinds, *_blob(texts))

    def format_encoded(self, values: np.ndarray, kinds: np.ndarray, blob: np.ndarray,
                       offsets: np.ndarray) -> np.ndarray:  # fmt: skip
        """:meth:`format_array` with the texts already encoded: text ``i`` is
        ``blob[offsets[i]:offsets[i + 1]]`` (a writer that keeps many texts from call to call, the
        trace's operation names, encodes each once: :class:`TextBlob`)."""
        assert values.shape == kinds.shape and values.shape[1:] == (self.columns,), (values.shape, kinds.shape)
        assert values.dtype == np.int64 and kinds.dtype == np.int8, (values.dtype, kinds.dtype)
        if not len(values):
            return np.zeros(0, dtype=np.uint8)
        return _format(values, kinds, self._pieces[0], self._pieces[1], blob, offsets, *self._sep)


class TextBlob:
    """Texts encoded once and kept end to end, with a few texts of the call put before them
    (:meth:`with_prefix`): text ``len(prefix) + i`` of the result is the blob's text ``i``."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ends = [0]  # where each text ends in the blob (after the 0 where the first starts)
        self._joined: tuple[bytes, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._parts)

    def append(self, text: str) -> int:
        """Add ``text``; returns its number."""
        data = text.encode()
        self._parts.append(data)
        self._ends.append(self._ends[-1] + len(data))
        self._joined = None
        return len(self._parts) - 1

    def with_prefix(self, prefix: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The blob and offsets (as :func:`_blob` gives them) of ``prefix`` followed by the texts added."""
        if self._joined is None:
            self._joined = b"".join(self._parts), np.array(self._ends, dtype=np.int64)
        head = [t.encode() for t in prefix]
        at = np.zeros(len(head) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in head], out=at[1:])
        data, offsets = self._joined
        return (np.frombuffer(b"".join(head) + data or b"\0", dtype=np.uint8),
                np.concatenate((at[:-1], offsets + at[-1])))  # fmt: skip
