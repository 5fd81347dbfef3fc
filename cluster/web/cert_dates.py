"""When a PEM certificate stops being valid: its X.509 `notAfter`, read from the DER
itself. The ssl module loads a certificate without looking at its dates, and reads them
only through a private function; this reads the few fields in front of them (RFC 5280,
4.1: version, serial number, signature algorithm, issuer, then validity)."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["not_after"]

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at `at`."""
    tag, length = der[at], der[at + 1]
    start = at + 2
    if length & 0x80:
        size = length & 0x7F
        length = int.from_bytes(der[start : start + size], "big")
        start += size
    if start + length > len(der):
        raise ValueError("element runs past the end")
    return tag, start, start + length


def _time(tag: int, text: bytes) -> datetime:
    value = text.decode("ascii")
    if tag == _UTC_TIME:  # YYMMDDHHMMSSZ, years 1950-2049
        year = int(value[:2])
        value = f"{1900 + year if year >= 50 else 2000 + year}{value[2:]}"
    elif tag != _GENERALIZED_TIME:
        raise ValueError(f"tag {tag:#x} is not a time")
    return datetime.strptime(value, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)


def not_after(path: Path) -> datetime | None:
    """The first certificate's `notAfter` in the PEM file at `path`; None when the file
    holds none this can read (OpenSSL has the last word on what it accepts)."""
    try:
        match = _PEM.search(path.read_bytes())
        if match is None:
            return None
        der = base64.b64decode(b"".join(match.group(1).split()), validate=True)
        tag, start, _ = _element(der, 0)  # Certificate
        tag, at, _ = _element(der, start)  # TBSCertificate
        if tag != _SEQUENCE:
            return None
        if der[at] == _VERSION:
            at = _element(der, at)[2]
        for _skipped in ("serialNumber", "signature", "issuer"):
            at = _element(der, at)[2]
        tag, at, _ = _element(der, at)  # Validity
        if tag != _SEQUENCE:
            return None
        at = _element(der, at)[2]  # notBefore
        tag, start, end = _element(der, at)
        return _time(tag, der[start:end])
    except (OSError, ValueError, IndexError, binascii.Error):
        return None
