"""How limit keys map to Redis key names on a node.

Counter:  c<shape id>|<limit key>        shape id: 8 base64url chars naming (scope, shape)
Record:   r|<scope>|<request id>|<limit key>   a check's first decision and its request
                                           fingerprint (request_fingerprint)
Adjusted: r|<scope>|!<request id>|<limit key>   a quota adjustment's record ("!" is
                                           never in a request id: no clash with checks)
Spread:   <limit key>#<i>                   sub-counter i of a `spread: N` rule's key,
                                           an ordinary limit key placed on its own

Node-local keys (never migrated; they start with "sl|", outside DATA_KEYS_PATTERN):
Holds:    sl|holds                          all-or-nothing holds, for the sweeper
Decision: sl|d|<batch id>                   an all-or-nothing batch's commit/abort
Pending:  sl|dp|<batch id>                  holds of a committed batch not yet settled
Lease:    sl|lease|<name>                   topology or rules change lease; the shard's
                                           sweeper lease (one endpoint sweeps its holds)
Marker:   sl|i|<migration id>|<redis key>   a key already imported by a migration
Markers:  sl|im|<migration id>              the markers a migration set (a set), to drop them
Rules:    sl|rules                          the cluster's rules: version, document
Topology: sl|topology                       the node's last topology (JSON), its cluster id
Epoch:    sl|epoch                          the newest topology epoch an endpoint of the
                                           shard adopted: writes placed by an older one
                                           are refused (the shard's epoch fence)
Fence:    sl|d-fence                        decisions handed to a successor: refuse new ones
Expired:  sl|leases-expired                 leases pruned unrenewed (a count, for metrics)

The limit key always comes last and the other parts never contain "|", so the
limit key (and therefore the owner) of any Redis key can be recovered; this is
what lets a node hand over exactly the keys that change owner.

Counter names are short on purpose: a Redis key with a TTL costs about 69 bytes
of dict entries before its name and value, and counters are most of the keys a
node holds. The shape id is a 48-bit digest of "<scope>|<shape>" (scope = rule
name, shape = algorithm and window/period/timezone, and the scale of amounts
other than 2), so a thousand distinct
shapes collide with probability about 2e-9.
"""

from __future__ import annotations

import base64
import hashlib
import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

INLINE_SCOPE = "~inline"
MAX_KEY_BYTES = 512
# \Z, not $: $ also matches before a final newline ("basic\n"). Not "." or "..", which
# clients that normalise URL paths would never send as /v1/rules/<name>.
RULE_NAME = re.compile(r"^(?!\.\.?\Z)[A-Za-z0-9_.:-]{1,64}\Z")
RULE_NAME_TEXT = "1-64 characters of A-Z a-z 0-9 _ . : - (not . or ..)"
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:@~+=/-]{1,128}\Z")
# SCAN pattern that finds every counter and record (and nothing else of ours).
DATA_KEYS_PATTERN = "[cr]*"
_SHAPE_ID_CHARS = 8

HOLDS_KEY = "sl|holds"
DECISION_PREFIX = "sl|d|"  # + batch id
PENDING_PREFIX = "sl|dp|"  # + batch id: a set of hold ids (see hold_id)
RULES_KEY = "sl|rules"  # a hash: version, doc (JSON)
TOPOLOGY_KEY = "sl|topology"  # the node's topology (JSON), kept across restarts
# The newest topology epoch any endpoint of the shard adopted (an integer), raised with
# TOPOLOGY_KEY; counter scripts placed by an older epoch refuse to run against it.
SHARD_EPOCH_KEY = "sl|epoch"
# Held by the one endpoint of a shard that sweeps its holds (node/holds/singleton.py).
SWEEPER_LEASE_KEY = "sl|lease|sweeper"
DECISION_FENCE_KEY = "sl|d-fence"  # set once a leaving coordinator handed its records over
# Leases of concurrency limits that expired unrenewed, pruned here (a count, for metrics;
# node/store/lua/concurrency.lua spells it too).
LEASES_EXPIRED_KEY = "sl|leases-expired"
# One of each per node, kept for good: not keys the node holds for limits.
NODE_SINGLETONS = (
    RULES_KEY,
    TOPOLOGY_KEY,
    SHARD_EPOCH_KEY,
    SWEEPER_LEASE_KEY,
    DECISION_FENCE_KEY,
    LEASES_EXPIRED_KEY,
)
LEASES = ("topology", "rules")


def lease_key(name: str) -> str:
    return f"sl|lease|{name}"


def hold_id(request_id: str, key: str) -> str:
    """Names one hold of a batch: its request id and limit key (neither has "|"
    before the key)."""
    return f"{request_id}|{key}"


def hold_id_of(record: str) -> str | None:
    """The hold id of an idempotency record's Redis key, or None if it is not one."""
    parts = record.split("|", 3)
    return f"{parts[2]}|{parts[3]}" if len(parts) == 4 and parts[0] == "r" else None


def marker_key(migration_id: str, redis_key: str) -> str:
    return f"sl|i|{migration_id}|{redis_key}"


def marker_index_key(migration_id: str) -> str:
    return f"sl|im|{migration_id}"


@lru_cache(maxsize=4096)
def shape_id(scope: str, shape: str) -> str:
    digest = hashlib.blake2b(f"{scope}|{shape}".encode(), digest_size=6).digest()
    return base64.urlsafe_b64encode(digest).decode()


def counter_key(scope: str, shape: str, key: str) -> str:
    return f"c{shape_id(scope, shape)}|{key}"


def record_key(scope: str, request_id: str, key: str) -> str:
    return f"r|{scope}|{request_id}|{key}"


def request_fingerprint(
    scope: str, inline_limits: list[list[Any]] | None, cost: int, amount: Decimal
) -> str:
    """What a request_id promises to repeat: the rule (or the inline limits, in their
    normalised wire form), cost and amount. The limit key and the scope are part of the
    record's name already. `dry_run` is not part of it: it says whether to consume, not
    what is asked. 16 hex characters (64 bits) of blake2b."""
    limits = "" if inline_limits is None else repr(inline_limits)
    text = f"{scope}\x00{limits}\x00{cost}\x00{amount_text(amount)}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# Beyond this many digits either side of the point an amount is written with an exponent.
_PLAIN_DIGITS = 30


def amount_text(amount: Decimal) -> str:
    """One text per amount, whatever its form ("1.50", "1.5e0" -> "1.5"). An amount that
    no limit takes (a rule without calendar or quota limits ignores it) can be any
    decimal: `normalize()` overflows past 1e999999, and written out in full "1e-999999"
    is a megabyte, so those get a stripped coefficient and an exponent instead."""
    if not amount:
        return "0"
    if -_PLAIN_DIGITS <= amount.adjusted() <= _PLAIN_DIGITS:
        return format(amount.normalize(), "f")
    sign, digits, exponent = amount.as_tuple()
    coefficient = "".join(map(str, digits)).rstrip("0")
    shift = len(digits) - len(coefficient)
    return f"{'-' if sign else ''}{coefficient}e{int(exponent) + shift}"


def adjust_record_key(scope: str, request_id: str, key: str) -> str:
    return f"r|{scope}|!{request_id}|{key}"


SPREAD_SEPARATOR = "#"


def sub_key(key: str, index: int) -> str:
    """The limit key of sub-counter `index` of a spread key."""
    return f"{key}{SPREAD_SEPARATOR}{index}"


def limit_key_of(redis_key: str) -> str | None:
    """The limit key a Redis key belongs to, or None for keys that are not ours."""
    if redis_key.startswith("c"):
        if len(redis_key) > _SHAPE_ID_CHARS + 1 and redis_key[_SHAPE_ID_CHARS + 1] == "|":
            return redis_key[_SHAPE_ID_CHARS + 2 :]
        return None
    if redis_key.startswith("r|"):
        parts = redis_key.split("|", 3)
        return parts[3] if len(parts) == 4 else None
    return None
