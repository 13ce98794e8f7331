"""Job configs (TOML): which models, which tasks, how to train.  Plain data, validated here."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from actorjet.errors import UserError


def tree_path(name: str) -> Path:
    """Find a bundled supervisor tree: the repo checkout first, then the installed share dir."""
    for base in (Path(__file__).resolve().parent.parent / "supervisors",
                 Path(sys.prefix) / "share" / "actorjet" / "supervisors"):
        if (base / name).exists():
            return base / name
    raise UserError(f"bundled supervisor tree {name} not found; pass --tree FILE")


def load_job(path: str | Path) -> dict:
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read job config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: malformed TOML: {e}") from None
