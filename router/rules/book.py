"""Rules: named sets of limits, from a YAML file (hot-reloaded) and the admin API."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from cluster.model.errors import FieldError, Problems, ValidationError
from cluster.model.keys import INLINE_SCOPE, RULE_NAME, RULE_NAME_TEXT
from cluster.model.limits import LimitSpec, parse_limits
from router.rules.rejection import Rejection, file_block, rejected_now, yaml_cause
from router.rules.spread_split import check_spread, split_limits
from router.rules.watched_file import WatchedFile
from router.rules.yaml_text import ExactLoader, NotAName, StrictLoader, not_utf8

log = logging.getLogger("shardlimit.rules")
ON_FAILURE = ("allow", "deny")
RULE_FIELDS = frozenset(
    {"limits", "on_failure", "name", "spread", "cache_denials", "shadow", "durability"}
)
DURABILITY = ("primary", "replica")


@dataclass(frozen=True)
class Rule:
    name: str  # INLINE_SCOPE for limits given inline in a check
    limits: tuple[LimitSpec, ...]
    on_failure: str
    wire: tuple[list[Any], ...]
    # `spread: N` (router/decide/spread.py): N > 1 sub-counters, each with its share of the limits.
    spread: int = 1
    sub_wires: tuple[tuple[list[Any], ...], ...] = ()
    # `cache_denials: true` (router/decide/denial_cache.py): a used-up key is answered locally.
    cache_denials: bool = False
    # `shadow: true`: decided and counted as usual, but a denial is answered as allowed.
    shadow: bool = False
    # "replica": a check is acknowledged only once a replica of its shard holds it.
    durability: str = "primary"
    # A concurrency limit among `limits`: a check may acquire a lease (router/decide/leases.py).
    leases: bool = False
    # `wire` as the list an op carries, shared by every op of the rule (never mutated).
    wire_list: list[list[Any]] = field(default_factory=list, compare=False, repr=False)
    # The place of its concurrency limit (-1: none), and that limit's wire as the list a
    # renewal or release carries (shared, never mutated).
    lease_at: int = field(default=-1, compare=False, repr=False)
    lease_wire: list[list[Any]] = field(default_factory=list, compare=False, repr=False)

    @property
    def public_name(self) -> str | None:
        return None if self.name == INLINE_SCOPE else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **_body(self)}


def _body(rule: Rule) -> dict[str, Any]:
    body: dict[str, Any] = {
        "limits": [spec.to_dict() for spec in rule.limits],
        "on_failure": rule.on_failure,
    }
    if rule.spread > 1:
        body["spread"] = rule.spread
    if rule.cache_denials:
        body["cache_denials"] = True
    if rule.shadow:
        body["shadow"] = True
    if rule.durability != default_durability(rule.limits):
        body["durability"] = rule.durability
    return body


def rules_document(rules: dict[str, Rule]) -> dict[str, Any]:
    """Rules by name as a rules file holds them under `rules:` (and as the cluster
    stores them)."""
    return {name: _body(rule) for name, rule in sorted(rules.items())}


def default_on_failure(limits: tuple[LimitSpec, ...]) -> str:
    """Money, quotas and leases fail closed (a degraded answer grants no lease); plain
    rate limits fail open."""
    money = ("calendar", "quota", "concurrency")
    return "deny" if any(spec.algorithm in money for spec in limits) else "allow"


def default_durability(limits: tuple[LimitSpec, ...]) -> str:
    """Money and quotas survive a failover; plain rate limits take the cheaper way."""
    money = ("calendar", "quota")
    return "replica" if any(spec.algorithm in money for spec in limits) else "primary"


def lease_problems(rule: Rule, cost: Any, path: str, problems: Problems) -> None:
    """A check of a concurrency limit acquires one lease, renewed by its rule's name."""
    if rule.name == INLINE_SCOPE:
        problems.add(f"{path}limits", "a concurrency limit needs a named rule (leases name it)")
    elif type(cost) is int and cost > 1:
        problems.add(
            f"{path}cost", "must be 0 or 1: a check of a concurrency limit takes one lease"
        )


def make_rule(
    name: str,
    limits: tuple[LimitSpec, ...],
    on_failure: str | None = None,
    spread: int = 1,
    cache_denials: bool = False,
    shadow: bool = False,
    durability: str | None = None,
) -> Rule:
    subs = split_limits(limits, spread) if spread > 1 else ()
    wire = tuple(spec.to_wire() for spec in limits)
    lease_at = next((i for i, s in enumerate(limits) if s.algorithm == "concurrency"), -1)
    return Rule(
        name=name,
        limits=limits,
        on_failure=on_failure or default_on_failure(limits),
        wire=wire,
        spread=spread,
        sub_wires=tuple(tuple(spec.to_wire() for spec in sub) for sub in subs),
        cache_denials=cache_denials,
        shadow=shadow,
        durability=durability or default_durability(limits),
        leases=lease_at >= 0,
        wire_list=list(wire),
        lease_at=lease_at,
        lease_wire=[wire[lease_at]] if lease_at >= 0 else [],
    )


def parse_rule(name: str, data: Any, path: str, problems: Problems) -> Rule | None:
    before = len(problems.errors)
    if not RULE_NAME.match(name):
        problems.add(path, f"rule names are {RULE_NAME_TEXT}")
    if not isinstance(data, dict):
        problems.add(path, "must be an object with 'limits'")
        return None
    for extra in sorted(set(data) - RULE_FIELDS, key=str):  # YAML: any key type
        problems.add(f"{path}.{extra}", "unknown field")
    if data.get("name") not in (None, name):  # as GET answers it, or left out
        problems.add(f"{path}.name", f"must be {name!r} (the rule's own name) or null")
    limits = parse_limits(data.get("limits"), f"{path}.limits", problems)
    spread = 1
    if "spread" in data and limits:
        spread = check_spread(data["spread"], limits, f"{path}.spread", problems)
    on_failure = data.get("on_failure")
    if on_failure is not None and on_failure not in ON_FAILURE:
        problems.add(f"{path}.on_failure", "must be 'allow' or 'deny'")
    durability = data.get("durability")
    if durability is not None and durability not in DURABILITY:
        problems.add(f"{path}.durability", "must be 'primary' or 'replica'")
    flags = {flag: data.get(flag, False) for flag in ("cache_denials", "shadow")}
    for flag, value in flags.items():
        if not isinstance(value, bool):
            problems.add(f"{path}.{flag}", "must be true or false")
    if flags["cache_denials"] is True and any(s.algorithm == "concurrency" for s in limits):
        problems.add(
            f"{path}.cache_denials",
            "cannot cache a concurrency limit's denials: a released lease frees a slot at once",
        )
    if len(problems.errors) != before:
        return None
    return make_rule(
        name,
        limits,
        on_failure,
        spread,
        flags["cache_denials"] is True,
        flags["shadow"] is True,
        durability,
    )


MISSING_RULES = (
    "a rules document is a mapping with a top-level 'rules:' mapping (`rules: {}` for none)"
)


# The keys of a rules file: `rules:`, and a `version:` older routers wrote (ignored).
FILE_KEYS = frozenset({"rules", "version"})


def parse_rules_document(doc: Any, keys: frozenset[str] = FILE_KEYS) -> dict[str, Rule]:
    """A rules document (a file, `PUT /v1/rules`): `rules:` must be there, so a file
    that lost it (or an empty one) is refused rather than read as "no rules", and any
    key but `keys` is refused. Raises ValidationError."""
    problems = Problems()
    rules: dict[str, Rule] = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), dict):
        raise ValidationError([FieldError("rules", MISSING_RULES)])
    for extra in sorted(set(doc) - keys, key=str):  # YAML: any key type
        problems.add(str(extra), "unknown field")
    for name, body in doc["rules"].items():
        if isinstance(name, bool) or name is None:
            message = f"is {name} to YAML: quote a rule name such as on, yes, no or null"
            problems.add(f"rules.{name}", message)
            continue
        if not isinstance(name, str):
            problems.add(f"rules.{name}", f"is {name!r} to YAML: quote the rule name")
            continue
        rule = parse_rule(str(name), body, f"rules.{name}", problems)
        if rule is not None:
            rules[rule.name] = rule
    problems.raise_if_any()
    return rules


_STR = "tag:yaml.org,2002:str"
# Names YAML reads as true, false or null: parse_rules_document refuses them; and `<<:`.
_NOT_CHECKED = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:merge")


class RulesFileError(ValueError):
    """A rules file that cannot be read as one: one line that names the file."""


def _refuse_unquoted_names(loader: StrictLoader, root: yaml.Node | None) -> None:
    """A rule name YAML reads as a number, a date or the like (`0x10` is 16, `12:30` is
    750) would be published under another name: refused, naming it as written."""
    if not isinstance(root, yaml.MappingNode):
        return
    for key, value in root.value:
        if key.tag != _STR or key.value != "rules" or not isinstance(value, yaml.MappingNode):
            continue
        for name, _body in value.value:
            if name.tag == _STR or name.tag in _NOT_CHECKED:
                continue
            if isinstance(name, yaml.ScalarNode):
                read = loader.construct_object(name, deep=True)
                kind = "float" if isinstance(read, Decimal) else type(read).__name__
                said = (
                    f"rule name {name.value} is the {kind} {read} to YAML: "
                    f'quote it ("{name.value}":)'
                )
            else:
                said = "a rule name is a word, not a YAML collection"
            raise NotAName(None, None, said, name.start_mark)


def load_rules_text(text: str) -> Any:
    """A rules file's YAML document. Raises yaml.YAMLError: not YAML, a key given twice in
    one mapping, a rule name YAML reads as another type."""
    loader = ExactLoader(text)
    try:
        root = loader.get_single_node()
        _refuse_unquoted_names(loader, root)
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def read_rules_yaml(path: Path) -> Any:
    """The YAML document of the rules file at `path`. Raises RulesFileError."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise RulesFileError(f"cannot read {path}: the rules file does not exist") from exc
    except OSError as exc:
        raise RulesFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RulesFileError(not_utf8(path, exc)) from exc
    try:
        return load_rules_text(text)
    except yaml.YAMLError as exc:
        raise RulesFileError(yaml_cause(path, exc)) from exc


def read_rules_file(path: Path) -> dict[str, Rule]:
    """The rules of the rules file at `path`, read as a router reads it. Raises
    RulesFileError (one line naming the file)."""
    doc = read_rules_yaml(path)
    try:
        return parse_rules_document(doc)
    except ValidationError as exc:
        raise RulesFileError(f"{path}: {exc}") from exc


class RuleBook(WatchedFile):
    """The rules this router serves and their cluster version (router/rules/cluster_rules.py),
    and the last good reading of its rules file. File edits and SIGHUP reload the file;
    it is served only until the cluster first answers (version 0), otherwise published
    through the cluster. A router never writes the file."""

    LOAD_ERRORS = (yaml.YAMLError, ValueError)

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.rules: dict[str, Rule] = {}  # served
        self.version = 0  # the cluster's version of `rules`; 0: not from the cluster yet
        self.file_rules: dict[str, Rule] = {}
        # A `version:` the file names (routers once wrote it there): shown, never used.
        self.file_version: int | None = None
        # The file's last edit that was refused (None: its last edit was not).
        self.rejected: Rejection | None = None

    def load(self) -> None:
        """Raises ValidationError (a missing, unreadable or refused file: the rules stay)."""
        if self.path is None:
            return
        mtime = self.path.stat().st_mtime if self.path.exists() else None
        try:
            doc = read_rules_yaml(self.path)
            rules = parse_rules_document(doc)
        except RulesFileError as exc:
            self._refused(mtime, str(exc))
            raise ValidationError([FieldError("rules_file", str(exc))]) from exc
        except ValidationError as exc:
            self._refused(mtime, f"{self.path}: {exc}")
            raise
        file_version = doc.get("version")
        if file_version is not None:
            log.warning(
                "rules file %s: `version: %s` ignored (versions belong to the cluster)",
                self.path,
                file_version,
            )
        self.file_version = file_version if isinstance(file_version, int) else None
        self.file_rules = rules
        if self.version == 0:
            self.rules = rules
        self._mtime = mtime
        self.reloads += 1

    def _refused(self, mtime: float | None, cause: str) -> None:
        self.reload_errors += 1
        self._mtime = mtime
        self.reject(cause)

    def reject(self, cause: str) -> None:
        """The file's last edit was refused (`cause`: one line): the rules stay."""
        self.rejected = rejected_now(cause)
        log.error("rules file rejected, keeping rules version %d: %s", self.version, cause)

    def accepted(self) -> None:
        """An edit of the file was taken (published, or served before the cluster
        answered): an earlier refusal is no longer news."""
        if self.rejected is not None:
            log.info("rules file accepted again: %s", self.path)
        self.rejected = None

    def file_block(self) -> dict[str, Any]:
        return file_block(self.path, self.rejected, self.version)

    def get(self, name: str) -> Rule | None:
        return self.rules.get(name)

    def set_all(self, rules: dict[str, Rule], version: int) -> None:
        self.rules = dict(rules)
        self.version = version
