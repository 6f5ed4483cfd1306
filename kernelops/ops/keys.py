"""Cache keys: sequence-length bucketing and the key <-> text form used on disk and in shipped files.

A key is a tuple of ``(field, value)`` pairs whose values are primitives (str, int, bool, None).
Fields an op lists as *bucketed* hold lengths rounded up to the next power of two, so that
variable lengths share one tuned entry, and pretuned lookup can fall back to the nearest bucket.
"""

from __future__ import annotations

import math

Key = tuple[tuple[str, object], ...]


def bucket(n: int) -> int:
    """Next power of two >= n (1 for n <= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def key_text(key: Key) -> str:
    """``(("dtype", "float16"), ("seq_q", 1024))`` -> ``"dtype=float16|seq_q=1024"``."""
    parts = []
    for field, value in key:
        text = str(value)
        if isinstance(value, str) and _parse_value(text) != value:
            raise ValueError(f"key field {field!r}: string value {value!r} would read back as "
                             f"{_parse_value(text)!r}; use a non-numeric spelling")
        if "|" in text or "=" in text or "|" in field or "=" in field:
            raise ValueError(f"key field {field!r}={value!r} holds a reserved character ('|' or '=')")
        parts.append(f"{field}={text}")
    return "|".join(parts)


def _parse_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_key_text(text: str) -> Key:
    """Inverse of :func:`key_text`."""
    out = []
    for part in text.split("|"):
        field, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"malformed key text {text!r}: part {part!r} has no '='")
        out.append((field, _parse_value(value)))
    return tuple(out)


def bucket_distance(a: Key, b: Key, bucketed: tuple[str, ...]) -> float | None:
    """Distance between two keys that differ only in bucketed fields, else None.

    The distance is the sum over bucketed fields of |log2(a) - log2(b)|, so 1k vs 2k is as far as
    8k vs 16k.
    """
    da, db = dict(a), dict(b)
    if set(da) != set(db):
        return None
    total = 0.0
    for field in da:
        if field in bucketed:
            va, vb = da[field], db[field]
            if not isinstance(va, int) or not isinstance(vb, int):
                return None
            total += abs(math.log2(max(va, 1)) - math.log2(max(vb, 1)))
        elif da[field] != db[field]:
            return None
    return total
