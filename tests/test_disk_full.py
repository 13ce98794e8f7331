"""A full disk in the middle of training: the run directory sits on a small tmpfs, and a
ballast file fills it while the learner steps.  The gateway's call records, the episode
store, the learner's weight versions, store updates and checkpoints, and the metrics writer
all meet ENOSPC.  Training pauses with one status line (no crash loop, no silent stall),
nothing already written is damaged, and once the ballast is gone training finishes by
itself with every step's line in metrics.jsonl."""
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

import jobs
from actorjet.cli.tables import print_status
from actorjet.models import checkpoint_write
from actorjet.monitor import metrics
from actorjet.registry.group_log import GroupLog
from actorjet import disk
from actorjet.serving import weights
from actorjet.store.records import CallRecord
from actorjet.runtime.head import attach_root, status as head_status
from actorjet.store.episode_store import EpisodeStore
from swarm import REPO, pid_of, wait_until

STEPS, GROUPS, EVERY = 16, 4, 2


# who may meet the full disk: the gateway (recording calls), the learner (weights, checkpoints),
# the registry (a group finished or a metrics line in the pause: groups.jsonl, metrics.jsonl)
WRITERS = {"gateway.policy", "learner.policy", "registry (groups.jsonl)", "registry (metrics.jsonl)"}


@contextlib.contextmanager
def tmpfs(folder, size: str):
    """A tmpfs of its own (a disk that can fill without filling this machine's)."""
    folder.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"mounting a tmpfs needs root: {made.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "256m") as folder:
        yield folder


@pytest.fixture
def tiny_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "4m") as folder:
        yield folder


def fill(folder) -> int:
    """Grow the ballast file until the disk is full; returns what it added (a writer that frees
    space — the learner pruning an old checkpoint — is topped up by calling it again)."""
    with open(folder / "ballast", "ab") as f:
        block, size = b"\0" * (1 << 20), 0
        try:
            while True:
                size += f.write(block)
                f.flush()
        except OSError:
            pass
    return size


def test_metrics_and_group_lines_wait_whole_and_go_out_when_space_is_freed(tiny_disk):
    writer, groups = metrics.Writer(tiny_disk), GroupLog(tiny_disk)
    assert writer.write({"kind": "train", "step": 1}) == "" and groups.add([{"group_id": "g1"}]) == ["g1"]
    fill(tiny_disk)
    cause = writer.write({"kind": "train", "step": 2, "pad": "x" * 100_000})
    assert "No space left on device" in cause and len(writer.waiting) == 1
    assert groups.add([{"group_id": "g1"}, {"group_id": "g2", "pad": "x" * 100_000}]) == ["g1"]   # g2: told again
    assert "No space left on device" in groups.cause
    assert [r["step"] for r in metrics.read(tiny_disk)] == [1]              # no torn line
    (tiny_disk / "ballast").unlink()
    assert writer.write({"kind": "train", "step": 3}) == "" and not writer.waiting
    rows, bad = metrics.read_counted(tiny_disk)
    assert [r["step"] for r in rows] == [1, 2, 3] and bad == 0                # in order, each once
    assert groups.add([{"group_id": "g2"}]) == ["g2"] and groups.cause == ""
    assert [json.loads(line)["group_id"] for line in (tiny_disk / "groups.jsonl").read_text().splitlines()] == ["g1", "g2"]


def test_weights_and_checkpoints_that_do_not_fit_leave_nothing_behind(tiny_disk):
    """A version or checkpoint bigger than the room left fails as a full disk (torch.save hides
    the OS error: it is named from the room left), leaves no partial file, and gives the room
    back; what was written before is untouched."""
    small = {"w": torch.ones(1000)}
    weights.publish(small, tiny_disk / "v000001.safetensors")
    big = {"w": torch.ones(2_000_000)}                                        # 8 MB on a 4 MB disk
    with pytest.raises(OSError) as e:
        weights.publish(big, tiny_disk / "v000002.safetensors")
    assert disk.is_full(e.value) and sorted(p.name for p in tiny_disk.iterdir()) == ["v000001.safetensors"]
    loaded = {"w": torch.zeros(1000)}
    weights.load_into(loaded, tiny_disk / "v000001.safetensors")
    assert torch.equal(loaded["w"], small["w"])

    class Saver:              # what save_pretrained does for a model (or a tokenizer): its files
        def __init__(self, n, name="model"):
            self.tensors, self.name = {"w": torch.ones(n)}, name

        def save_pretrained(self, folder):
            save_file(self.tensors, folder / f"{self.name}.safetensors")

    params = [torch.nn.Parameter(torch.ones(400_000))]                       # 1.6 MB; AdamW's state 3.2 MB more
    optimizer = torch.optim.AdamW(params)
    params[0].grad = torch.ones(400_000)
    optimizer.step()
    folder = tiny_disk / "checkpoints"
    with pytest.raises(OSError) as e:
        checkpoint_write.write(folder, 2, 2, Saver(400_000), Saver(1, "tokenizer"), optimizer.state_dict())
    assert disk.is_full(e.value) and list(folder.iterdir()) == []
    del e                        # (its traceback holds torch's file open, as the learner's does not)
    assert disk.free_bytes(tiny_disk) > 3_000_000                            # its room given back
    small_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(10))])
    out = checkpoint_write.write(folder, 2, 2, Saver(1000), Saver(1, "tokenizer"), small_optimizer.state_dict())
    assert [p.name for p in folder.iterdir()] == ["step_000002"]
    assert json.loads((out / "state.json").read_text()) == {"step": 2, "weight_version": 2}


def test_calls_not_written_on_a_full_disk_are_never_referred_to(tiny_disk):
    """The store keeps each call as a reference to an earlier one (O(new tokens)): a call whose
    write failed must not become a later call's reference."""
    store = EpisodeStore(tiny_disk / "episodes.sqlite")

    def call(i, prompt):
        return CallRecord("e1", "m", "m", store.next_index("e1"), 0, prompt, [7, 8], [-0.1, -0.2], 0, 1.0,
                          [{"role": "user", "content": str(i)}], None, {}, "stop")

    store.add([call(0, list(range(100)))])
    store.flush()
    fill(tiny_disk)
    store.add([call(1, list(range(100)) + [7, 8] + list(range(50_000)))])     # 200 kB: does not fit
    with pytest.raises(sqlite3.OperationalError) as e:
        store.flush()
    assert disk.is_full(e.value)
    (tiny_disk / "ballast").unlink()
    store.add([call(2, list(range(100)) + [7, 8] + [5, 6])])
    store.flush()
    calls = store.calls(["e1"])["e1"]
    assert [c["call_index"] for c in calls] == [0, 2]
    assert calls[1]["prompt_ids"] == list(range(100)) + [7, 8] + [5, 6]
    with sqlite3.connect(tiny_disk / "episodes.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.slow
def test_a_full_disk_pauses_training_which_resumes_when_space_is_freed(swarm, small_disk, tmp_path):
    (tmp_path / "job.toml").write_text(jobs.tiny_arith(STEPS, groups_per_step=GROUPS, model=f"checkpoint_every = {EVERY}",
                                                       train="stall_s = 4.0"))   # the pause is longer: no stall
    run = small_disk / "run"
    _, port, _ = swarm.head(run, str(REPO / "supervisors" / "default.toml"), slots=1,
                            extra=["--config", str(tmp_path / "job.toml")])
    status = lambda: head_status(*attach_root(port))  # noqa: E731
    step = lambda: status()["models"][0]["learner_step"]  # noqa: E731
    wait_until(lambda: step() >= 3, 120, interval_s=0.2, what="learner step 3")

    assert fill(small_disk) > 0
    data = wait_until(lambda: (s := status())["paused"] and s, 30, interval_s=0.2, what="the pause")
    paused_at, restarts = data["models"][0]["learner_step"], dict(data["restarts"])
    seen: dict[str, set] = {}
    for _ in range(16):                                   # paused: no step, no crash loop
        fill(small_disk)                                  # the disk stays full, whoever frees a little
        time.sleep(0.5)
        data = status()
        for who, cause in data["disk_full"].items():
            seen.setdefault(who, set()).add(cause.split(":")[0])
    print("full:", seen)
    # the last status may fall in a moment where some writer freed a little and probed room
    # (the pause lifts until the next fill): fill once more and read the pause as it stands
    fill(small_disk)
    data = wait_until(lambda: (s := status())["paused"] and s, 30, interval_s=0.2, what="the pause after a refill")
    assert data["models"][0]["learner_step"] <= paused_at + 1, (paused_at, data["models"])
    assert data["restarts"] == restarts, data["restarts"]
    assert data["models"][0]["learner_step"] < STEPS
    assert data["paused"].startswith("PAUSED: disk full — ") and set(data["disk_full"]) <= WRITERS
    assert all("disk is full" in cause or "No space left on device" in cause for cause in data["disk_full"].values())
    console = Console(record=True, width=400)
    print_status(data, console)                           # and `actorjet status` says so, in one line
    assert [line for line in console.export_text().splitlines() if line.startswith("PAUSED: disk full")]

    # A learner that dies while the disk is full restarts once and waits: its first write (the
    # store's rewind) meets the full disk and must not crash-loop it
    learner = pid_of(port, "model.policy/learner")
    os.kill(learner, signal.SIGKILL)
    wait_until(lambda: pid_of(port, "model.policy/learner") not in (None, learner), 30, interval_s=0.2,
               what="the learner restarted")
    for _ in range(12):
        fill(small_disk)
        time.sleep(0.5)
    data = status()
    after = {path: n for path, n in data["restarts"].items() if restarts.get(path) != n}
    assert list(after) == ["root/model.policy/learner"] and after["root/model.policy/learner"] == \
        restarts.get("root/model.policy/learner", 0) + 1, data["restarts"]
    assert data["paused"] and data["models"][0]["learner_step"] < STEPS
    restarts = dict(data["restarts"])

    (small_disk / "ballast").unlink()                     # space again: it goes on by itself
    wait_until(lambda: status()["training_finished"], 180, interval_s=0.5, what=f"{STEPS} learner steps")
    data = status()
    assert data["models"][0]["learner_step"] == STEPS and not data["paused"] and not data["disk_full"]
    assert data["restarts"] == restarts, data["restarts"]

    # Nothing written was damaged, nothing the pause held back was lost.
    with sqlite3.connect(run / "episodes-policy.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    counts = EpisodeStore(run / "episodes-policy.sqlite").counts()
    assert counts["trained"] == STEPS * GROUPS, counts
    assert counts["complete"] == counts["trained"] + counts["pending"] + counts["quarantined"], counts
    rows, bad = metrics.read_counted(run)
    assert bad == 0
    # each step's line once, but for the steps after the checkpoint the killed learner resumed from
    steps, resumed = [r["step"] for r in rows if r["kind"] == "train"], data["recovered"]["policy"]["step"]
    before = steps[:len(steps) - (STEPS - resumed)]          # 1 … the last step before the kill
    assert before == list(range(1, len(before) + 1)) and steps[len(before):] == list(range(resumed + 1, STEPS + 1)), \
        (steps, resumed)
    checkpoints = run / "checkpoints" / "policy"
    assert not list(checkpoints.glob("tmp.*")) and not list((run / "weights" / "policy").glob("*.partial"))
    for folder in checkpoints.glob("step_*"):
        state = json.loads((folder / "state.json").read_text())
        assert state["step"] == int(folder.name[5:]) and (folder / "optimizer.pt").stat().st_size > 0


def test_untrainable_groups_wait_for_room_to_be_quarantined_each_once_in_order(tiny_disk):
    """The learner quarantines a batch its loss refused; on a full disk that write crashed it
    (a restart and a rewind).  Now the groups wait in the learner's QuarantineQueue, which
    says why, and go in when there is room."""
    from actorjet.store.quarantine_queue import QuarantineQueue
    from test_store import finish

    store = EpisodeStore(tiny_disk / "episodes.sqlite")
    for i in range(3):
        finish(store, f"g{i}", [0.0, 1.0])
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")      # no journal room left over to write into
    queue = QuarantineQueue(store)
    fill(tiny_disk)
    queue.add(["g0", "g1"], "learner: BadBatch: NaN in the loss")
    assert queue.flush() == [] and len(queue.waiting) == 2
    assert queue.cause.startswith("2 untrainable groups wait to be quarantined") and "full" in queue.cause.lower()
    (tiny_disk / "ballast").unlink()
    assert queue.flush() == [("g0", "learner: BadBatch: NaN in the loss"), ("g1", "learner: BadBatch: NaN in the loss")]
    assert queue.cause == "" and queue.flush() == []
    assert sorted(q["group_id"] for q in store.quarantined()) == ["g0", "g1"]
    assert store.counts()["quarantined"] == 2 and store.counts()["pending"] == 1
