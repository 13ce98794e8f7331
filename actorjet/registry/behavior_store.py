"""Every version of every behavior, kept durably in the run directory.

    RUN_DIR/behaviors/NAME/v3.pkl       the cloudpickled function, exactly as uploaded
    RUN_DIR/behaviors/NAME/index.json   versions (source, sha256, created, state) and current

Why on disk: a registry restarted by its supervisor, or a head restarted with
`actorjet start` on the same run directory, must go on serving the version that was live
(not the one in the job config), and `actorjet rollback` needs the old payloads.  The
store never unpickles anything: it only keeps bytes and their history.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class BehaviorStore:
    def __init__(self, run_dir: str | Path | None):
        self.root = Path(run_dir) / "behaviors" if run_dir else None
        self.memory: dict[str, dict] = {}      # used when there is no run dir (tests of the desk)

    # -- reading ------------------------------------------------------------------------
    def index(self, name: str) -> dict:
        if self.root is None:
            return self.memory.setdefault(name, {"current": None, "versions": []})
        path = self.root / name / "index.json"
        if not path.exists():
            return {"current": None, "versions": []}
        return json.loads(path.read_text())

    def blob(self, name: str, version: int) -> bytes:
        if self.root is None:
            return self.memory[name]["blobs"][version]
        return (self.root / name / f"v{version}.pkl").read_bytes()

    def current(self, name: str) -> int | None:
        return self.index(name)["current"]

    def entry(self, name: str, version: int) -> dict | None:
        return next((v for v in self.index(name)["versions"] if v["version"] == version), None)

    # -- writing ------------------------------------------------------------------------
    def add(self, name: str, blob: bytes, source: str, state: str = "pending") -> int:
        """Store a new version (not yet current); its number is one more than the last."""
        if not NAME_RE.match(name):
            raise ValueError(f"bad behavior name {name!r}")
        index = self.index(name)
        version = max((v["version"] for v in index["versions"]), default=0) + 1
        index["versions"].append({"version": version, "source": source, "state": state,
                                  "sha256": hashlib.sha256(blob).hexdigest(), "created": time.time()})
        if self.root is None:
            index.setdefault("blobs", {})[version] = blob
        else:
            folder = self.root / name
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_write(folder / f"v{version}.pkl", blob)
            self._save(name, index)
        return version

    def set_config(self, name: str, ref: str) -> None:
        """Remember which job-config function the lineage started from."""
        index = self.index(name)
        index["config"] = ref
        self._save(name, index)

    def mark(self, name: str, version: int, state: str, note: str = "") -> None:
        index = self.index(name)
        for v in index["versions"]:
            if v["version"] == version:
                v["state"] = state
                if note:
                    v["note"] = note[:2000]
        self._save(name, index)

    def activate(self, name: str, version: int) -> None:
        """Make ``version`` the one runners get; the one it replaces stays stored."""
        index = self.index(name)
        for v in index["versions"]:
            if v["version"] == version:
                v["state"] = "active"
            elif v["state"] == "active":
                v["state"] = "retired"
        index["current"] = version
        index.setdefault("history", []).append({"version": version, "at": time.time()})
        self._save(name, index)

    def previous(self, name: str) -> int | None:
        """The version that was current before the current one (for a plain rollback)."""
        history = [h["version"] for h in self.index(name).get("history", [])]
        current = self.current(name)
        for version in reversed(history):
            if version != current:
                return version
        return None

    def _save(self, name: str, index: dict) -> None:
        if self.root is None:
            self.memory[name] = index
            return
        _atomic_write(self.root / name / "index.json", json.dumps(index, indent=1).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
