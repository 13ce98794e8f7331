"""Node logs rotate by size across the node's processes (runtime/logs.py)."""
import logging
import multiprocessing as mp
import re

from actorjet.runtime.logs import SharedRotatingFileHandler


def _write(path: str, who: int, lines: int) -> None:
    log = logging.getLogger(f"test.rotation.{who}")
    log.propagate = False
    handler = SharedRotatingFileHandler(path, max_bytes=20_000, backups=50)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    for k in range(lines):
        log.warning("writer %d line %05d %s", who, k, "x" * 60)
    handler.close()


def test_four_processes_writing_one_log_rotate_it_by_size_and_lose_no_line(tmp_path):
    path = tmp_path / "actors.log"
    procs = [mp.get_context("fork").Process(target=_write, args=(str(path), w, 1500)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    files = [path] + sorted((f for f in tmp_path.glob("actors.log.*") if f.suffix[1:].isdigit()),
                            key=lambda f: int(f.suffix[1:]))
    assert len(files) > 10                                       # ~600 kB in 20 kB files
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert all(re.fullmatch(r"writer \d line \d{5} x{60}", line) for line in lines)     # none torn
    assert sorted(lines) == sorted(f"writer {w} line {k:05d} {'x' * 60}" for w in range(4) for k in range(1500))
    assert all(f.stat().st_size < 20_000 + 4 * 100 for f in files)      # rotated near the limit


def test_only_the_last_backups_are_kept(tmp_path):
    _write(str(tmp_path / "actors.log"), 0, 3000)                # ~240 kB, limit 20 kB, but keep 50 → all
    handler = SharedRotatingFileHandler(tmp_path / "small.log", max_bytes=1000, backups=2)
    log = logging.getLogger("test.rotation.small")
    log.propagate = False
    log.addHandler(handler)
    for k in range(600):                                        # ~5 kB: rotated 4 times
        log.warning("line %d", k)
    handler.close()
    assert sorted(p.name for p in tmp_path.glob("small.log*")) == ["small.log", "small.log.1", "small.log.2",
                                                                  "small.log.lock"]
