"""Supervisor trees declared as data, OTP style, loaded from TOML.

A tree file is one supervisor table: its strategy, restart intensity and backoff, and an
array of ``[[children]]``.  A child whose ``kind`` is ``"supervisor"`` carries the same
keys and its own ``[[children.children]]``.  Every mistake is reported with the file, the
line and the field, because a tree file is written by hand.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from actorjet.checks import int_in, number_in
from actorjet.errors import UserError
from actorjet.runtime import kinds

RESTART_TYPES = ("permanent", "transient", "temporary")
STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one", "simple_one_for_one")
CHILD_KEYS = {"id", "kind", "restart", "args", "placement", "registry"}
PLACEMENT_KEYS = {"node", "gpus", "cpus"}
MAX_DYNAMIC = 4096     # count of a simple_one_for_one supervisor: each child is a process
SUPERVISOR_KEYS = {"strategy", "max_restarts", "period_s", "backoff_initial_s",
                   "backoff_max_s", "children", "child_kind", "count"}


@dataclass
class ChildSpec:
    id: str
    kind: str
    restart: str = "permanent"
    args: dict = field(default_factory=dict)
    placement: dict = field(default_factory=dict)   # which node: {node = NAME} and/or {gpus = N, cpus = N}
    registry: bool = False       # the registry: every actor of the tree gets its address
    # only for kind == "supervisor":
    strategy: str = "one_for_one"
    max_restarts: int = 5
    period_s: float = 10.0
    backoff_initial_s: float = 0.0
    backoff_max_s: float = 5.0
    children: list["ChildSpec"] = field(default_factory=list)
    # only for strategy == "simple_one_for_one": the children made at run time
    child_kind: str = ""         # their kind, e.g. "runner"
    count: int = 0               # 0: one per slot of every live node; N: N of them, placed by free slots

    def kinds(self) -> set[str]:
        """Every actor kind this tree can start (a simple_one_for_one's children included)."""
        out = {self.kind} | ({self.child_kind} if self.child_kind else set())
        for child in self.children:
            out |= child.kinds()
        return out

    def to_dict(self) -> dict:
        """Plain data, so the spec travels inside thespian messages."""
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "ChildSpec":
        data = dict(data)
        data["children"] = [ChildSpec.from_dict(c) for c in data.get("children", [])]
        return ChildSpec(**data)


class _Located:
    """Finds the line a field sits on, for error messages (tomllib keeps no positions)."""

    def __init__(self, path: str, text: str):
        self.path, self.lines = path, text.splitlines()

    def line(self, child_id: str | None, key: str) -> int:
        start = 0
        if child_id is not None:
            pat = re.compile(r'^\s*id\s*=\s*["\']%s["\']' % re.escape(child_id))
            start = next((i for i, l in enumerate(self.lines) if pat.match(l)), 0)
        pat = re.compile(r"^\s*%s\s*=" % re.escape(key))
        for i in range(start, len(self.lines)):
            if pat.match(self.lines[i]):
                return i + 1
        return start + 1

    def error(self, child_id: str | None, key: str, what: str) -> UserError:
        return UserError(f"{self.path}:{self.line(child_id, key)}: field '{key}': {what}")


def load_tree(path: str | Path) -> ChildSpec:
    """Parse and validate a tree file; raise UserError naming file, line and field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read supervisor tree {path}: {e.strerror}") from None
    return parse_tree(text, str(path))


def parse_tree(text: str, name: str = "<tree>") -> ChildSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{name}: malformed TOML: {e}") from None
    loc = _Located(name, text)
    data.setdefault("id", "root")
    data["kind"] = "supervisor"
    spec = _child(data, loc, seen=set())
    flagged = [c.id for c in _walk(spec) if c.registry]
    if len(flagged) > 1:
        raise loc.error(flagged[1], "registry", f"only one child may be the registry (also: {flagged[0]!r})")
    if flagged and flagged[0] not in {c.id for c in spec.children}:
        raise loc.error(flagged[0], "registry", "the registry must be a child of the root supervisor")
    return spec


def _walk(spec: ChildSpec):
    for child in spec.children:
        yield child
        yield from _walk(child)


def _child(data: dict, loc: _Located, seen: set) -> ChildSpec:
    cid = data.get("id")
    if not isinstance(cid, str) or not cid or "/" in cid:
        raise loc.error(None, "id", f"every child needs a string id without '/', got {cid!r}")
    if cid in seen:
        raise loc.error(cid, "id", f"duplicate child id {cid!r} under one supervisor")
    seen.add(cid)
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise loc.error(cid, "kind", f"child {cid!r} needs a kind (one of {', '.join(kinds.names())})")
    allowed = CHILD_KEYS | (SUPERVISOR_KEYS if kind == "supervisor" else set())
    for key in data:
        if key not in allowed:
            raise loc.error(cid, key, f"unknown field for a {kind!r} child (allowed: {', '.join(sorted(allowed))})")
    try:
        kinds.resolve(kind)
    except UserError as e:
        raise loc.error(cid, "kind", str(e)) from None
    restart = data.get("restart", "permanent")
    if restart not in RESTART_TYPES:
        raise loc.error(cid, "restart", f"must be one of {', '.join(RESTART_TYPES)}, got {restart!r}")
    for key in ("args", "placement"):
        if not isinstance(data.get(key, {}), dict):
            raise loc.error(cid, key, "must be a table, e.g. args = { model = \"policy\" }")
    for key, value in data.get("placement", {}).items():
        if key not in PLACEMENT_KEYS:
            raise loc.error(cid, "placement", f"unknown placement key {key!r} (known: node, gpus, cpus)")
        if key == "node" and (not isinstance(value, str) or not value):
            raise loc.error(cid, "placement", "placement.node must be a node name, e.g. placement = { node = \"gpu1\" }")
        if key != "node" and not int_in(value, 0):
            raise loc.error(cid, "placement", f"placement.{key} must be a whole number >= 0")
    if not isinstance(data.get("registry", False), bool):
        raise loc.error(cid, "registry", "must be true or false")
    if kind == "registry" and not data.get("registry"):
        raise loc.error(cid, "kind", "the registry child needs `registry = true` (every other actor "
                        "gets its address from it)")
    spec = ChildSpec(id=cid, kind=kind, restart=restart, args=dict(data.get("args", {})),
                     placement=dict(data.get("placement", {})), registry=data.get("registry", False))
    if kind != "supervisor":
        return spec
    strategy = data.get("strategy", "one_for_one")
    if strategy not in STRATEGIES:
        raise loc.error(cid, "strategy", f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    spec.strategy = strategy
    if strategy == "simple_one_for_one":
        child_kind, count = data.get("child_kind"), data.get("count", 0)
        if not isinstance(child_kind, str) or not child_kind:
            raise loc.error(cid, "child_kind", "simple_one_for_one needs child_kind, the kind of the children it "
                            "makes at run time (e.g. child_kind = \"runner\")")
        try:
            kinds.resolve(child_kind)
        except UserError as e:
            raise loc.error(cid, "child_kind", str(e)) from None
        if not int_in(count, 0, MAX_DYNAMIC):
            raise loc.error(cid, "count", f"must be a whole number from 0 (one per slot) to {MAX_DYNAMIC}, "
                            f"got {count!r}")
        if data.get("children"):
            raise loc.error(cid, "children", "a simple_one_for_one supervisor declares no children: "
                            "it makes them from child_kind")
        spec.child_kind, spec.count = child_kind, count
    elif "child_kind" in data or "count" in data:
        key = "child_kind" if "child_kind" in data else "count"
        raise loc.error(cid, key, f"{key} is only for strategy = \"simple_one_for_one\"")
    for key, whole, minimum in (("max_restarts", True, 0), ("period_s", False, 0.001),
                                ("backoff_initial_s", False, 0), ("backoff_max_s", False, 0)):
        if key in data:
            value = data[key]
            if not (int_in(value, minimum) if whole else number_in(value, minimum)):
                raise loc.error(cid, key, f"must be a number >= {minimum}, got {value!r}")
            setattr(spec, key, value)
    children = data.get("children", [])
    if not isinstance(children, list):
        raise loc.error(cid, "children", "must be an array of tables: [[children]]")
    child_ids: set = set()
    spec.children = [_child(c, loc, child_ids) for c in children]
    return spec


def find(spec: ChildSpec, path: str) -> ChildSpec | None:
    """The spec at ``a/b/c`` below ``spec`` (used by tests and `actorjet status`)."""
    node = spec
    for part in [p for p in path.split("/") if p]:
        node = next((c for c in node.children if c.id == part), None)
        if node is None:
            return None
    return node
