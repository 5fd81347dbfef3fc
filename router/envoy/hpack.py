"""HPACK (RFC 7541) for the lean gRPC server (router/envoy/h2.py): a decoder of request
header blocks, with the dynamic table and Huffman strings, and the few fixed header
blocks a gRPC answer needs (literals that never touch the peer's dynamic table, so the
encoder keeps no state).

The Huffman code of RFC 7541 Appendix B is canonical: the code of each symbol follows
from the code lengths alone (codes of one length are consecutive, in symbol order, each
length's first code one past the last shorter one, shifted), so only the 257 lengths are
written here, as characters ('0' + length).
"""

from __future__ import annotations

_LENGTHS = (
    "=GLLLLLLLHNLLNLLLLLLLLNLLLLLLLLL6::<=68;::8;8666555666666678?6<:=6777777777777777777"
    "7777878=C=>6?56565666577666567655677777?;>=LDFDDFFFGFGGGGGHGHHFGHGGGGEFGFGGHFEDFFGGE"
    "GFFHEFGGEEFEGFGGDFFFGFFGJJDCFGFIJJJKKJHICEJKKJKHEEJJLKKKDHDEFEEGFFIIHHJGJKJJKKKKKLKK"
    "KKKJN"
)
EOS = 256
MAX_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE: the default, which the server keeps
# Huffman strings decoded once per connection: the short values a client repeats without
# indexing them (a user agent, a path); longer ones would make the cache a memory sink.
MAX_CACHED_STRINGS = 1024
MAX_CACHED_STRING = 128
# Whole header blocks decoded once per state of the dynamic table: a client that indexes
# what it repeats (Envoy) sends the same block, all references, for every call.
MAX_CACHED_BLOCKS = 256
MAX_CACHED_BLOCK = 1024
Headers = tuple[tuple[bytes, bytes], ...]


class HpackError(ValueError):
    """A header block that cannot be decoded: a COMPRESSION_ERROR of the connection."""


def _canonical() -> tuple[list[int], list[int], list[int], list[int]]:
    """Per code length: its first code, how many codes, and where its symbols start in
    the symbols sorted by (length, symbol)."""
    lengths = [ord(c) - ord("0") for c in _LENGTHS]
    ordered = sorted(range(len(lengths)), key=lambda s: (lengths[s], s))
    first, count, offset = [0] * 31, [0] * 31, [0] * 31
    code, previous = 0, lengths[ordered[0]]
    for index, symbol in enumerate(ordered):
        length = lengths[symbol]
        if index:
            code = (code + 1) << (length - previous)
        if count[length] == 0:
            first[length], offset[length] = code, index
        count[length] += 1
        previous = length
    return first, count, offset, ordered


_FIRST, _COUNT, _OFFSET, _SYMBOLS = _canonical()
_CODE_LENGTHS = tuple(n for n in range(31) if _COUNT[n])
_SHORTEST = _CODE_LENGTHS[0]


def huffman_decode(data: bytes) -> bytes:
    """Symbol by symbol from a small accumulator: shifting the whole string as one
    integer for each symbol made decoding quadratic in the string's length."""
    out = bytearray()
    acc = 0  # the last `bits` bits read, not decoded yet
    bits = 0
    for byte in data:
        acc = (acc << 8) | byte
        bits += 8
        while bits >= _SHORTEST:
            for length in _CODE_LENGTHS:
                if length > bits:
                    length = 0  # the next symbol needs more bits
                    break
                offset = ((acc >> (bits - length)) & ((1 << length) - 1)) - _FIRST[length]
                if offset < _COUNT[length]:
                    break
            else:
                raise HpackError("bad Huffman code")  # 30 bits always hold a code
            if not length:
                break
            symbol = _SYMBOLS[_OFFSET[length] + offset]
            if symbol == EOS:
                raise HpackError("EOS in a Huffman string")
            out.append(symbol)
            bits -= length
            acc &= (1 << bits) - 1
    # What is left is padding: fewer than 8 bits, all ones (the start of EOS).
    if bits > 7 or acc != (1 << bits) - 1:
        raise HpackError("bad Huffman padding")
    return bytes(out)


_STATIC_NAMES = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
]
_STATIC_VALUES = {
    2: "GET",
    3: "POST",
    4: "/",
    5: "/index.html",
    6: "http",
    7: "https",
    8: "200",
    9: "204",
    10: "206",
    11: "304",
    12: "400",
    13: "404",
    14: "500",
    16: "gzip, deflate",
}
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode(), _STATIC_VALUES.get(index, "").encode())
    for index, name in enumerate(_STATIC_NAMES, 1)
)
assert len(STATIC_TABLE) == 61


def decode_int(data: bytes, at: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer with a `prefix`-bit prefix starting at data[at]: (value, next)."""
    limit = (1 << prefix) - 1
    value = data[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while True:
        if at >= len(data) or shift > 28:
            raise HpackError("truncated or oversized integer")
        byte = data[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def encode_int(value: int, prefix: int, first: int = 0) -> bytes:
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """`name: value` as a literal without indexing, new name, no Huffman."""
    return b"\x00" + encode_int(len(name), 7) + name + encode_int(len(value), 7) + value


class Decoder:
    """One connection's decoding context (its dynamic table)."""

    def __init__(self) -> None:
        self.table: list[tuple[bytes, bytes]] = []  # newest first
        self.size = 0
        self.max_size = MAX_TABLE_SIZE
        self._strings: dict[bytes, bytes] = {}  # Huffman strings already decoded
        self._blocks: dict[bytes, Headers] = {}  # blocks decoded on the table as it is
        self._changes = 0  # of the table: entries added, its size updated

    def _string(self, data: bytes, at: int) -> tuple[bytes, int]:
        if at >= len(data):
            raise HpackError("truncated header field")
        huffman = data[at] & 0x80
        length, at = decode_int(data, at, 7)
        end = at + length
        if end > len(data):
            raise HpackError("truncated string")
        raw = data[at:end]
        if not huffman:
            return raw, end
        if len(raw) > MAX_CACHED_STRING:
            return huffman_decode(raw), end
        text = self._strings.get(raw)
        if text is None:
            text = huffman_decode(raw)
            if len(self._strings) >= MAX_CACHED_STRINGS:
                self._strings.clear()
            self._strings[raw] = text
        return text, end

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= 61:
            return STATIC_TABLE[index - 1]
        if 61 < index <= 61 + len(self.table):
            return self.table[index - 62]
        raise HpackError(f"header index {index} out of range")

    def _evict(self, room: int) -> None:
        while self.table and self.size + room > self.max_size:
            name, value = self.table.pop()
            self.size -= len(name) + len(value) + 32

    def _changed(self) -> None:
        self._changes += 1
        self._blocks.clear()

    def _add(self, name: bytes, value: bytes) -> None:
        self._changed()
        entry = len(name) + len(value) + 32
        self._evict(entry)
        if entry <= self.max_size:
            self.table.insert(0, (name, value))
            self.size += entry

    def decode(self, block: bytes) -> Headers:
        """A header block's fields, in order. A block that leaves the dynamic table as it
        was decodes alike until the table changes: it is kept, by its bytes, until then."""
        known = self._blocks.get(block)
        if known is not None:
            return known
        changes = self._changes
        headers = self._decode(block)
        if self._changes == changes and len(block) <= MAX_CACHED_BLOCK:
            if len(self._blocks) >= MAX_CACHED_BLOCKS:
                self._blocks.clear()
            self._blocks[block] = headers
        return headers

    def _decode(self, block: bytes) -> Headers:
        headers: list[tuple[bytes, bytes]] = []
        at, end = 0, len(block)
        while at < end:
            byte = block[at]
            if byte & 0x80:  # indexed
                index, at = decode_int(block, at, 7)
                headers.append(self._entry(index))
                continue
            if byte & 0xE0 == 0x20:  # dynamic table size update
                size, at = decode_int(block, at, 5)
                if size > MAX_TABLE_SIZE:
                    raise HpackError("table size update over the limit")
                self.max_size = size
                self._changed()
                self._evict(0)
                continue
            indexing = bool(byte & 0x40)
            index, at = decode_int(block, at, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, at = self._string(block, at)
            value, at = self._string(block, at)
            if indexing:
                self._add(name, value)
            headers.append((name, value))
        return tuple(headers)
