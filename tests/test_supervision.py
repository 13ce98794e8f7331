"""Supervisor strategies, restart intensity and escalation, on a real thespian system."""
import os
import signal
import time

import pytest

from actorjet.runtime import messages as m
from actorjet.runtime import system
from actorjet.runtime.head import Head
from actorjet.runtime.tree_spec import parse_tree
from swarm import free_port, wait_until

TREE = """
id = "root"
max_restarts = 50
[[children]]
id = "registry"
kind = "registry"
registry = true
[[children]]
id = "work"
kind = "supervisor"
strategy = "{strategy}"
max_restarts = {max_restarts}
period_s = 30
  [[children.children]]
  id = "a"
  kind = "probe"
  restart = "{restart_a}"
  args = {{ value = 1 }}
  [[children.children]]
  id = "b"
  kind = "probe"
  args = {{ value = 2 }}
  [[children.children]]
  id = "c"
  kind = "probe"
  args = {{ value = 3 }}
"""


@pytest.fixture
def make_head(tmp_path):
    heads = []

    def make(strategy="one_for_one", max_restarts=10, restart_a="permanent"):
        tree = TREE.format(strategy=strategy, max_restarts=max_restarts, restart_a=restart_a)
        head = Head(tmp_path / f"run{len(heads)}", parse_tree(tree), port=free_port())
        heads.append(head)
        head.start()
        return head

    yield make
    for head in heads:
        head.stop()


def pong(head, path):
    def ask():
        addr = head.lookup(path)
        reply = system.ask(head.asys, addr, m.Ping(), m.Pong, 0.5) if addr else None   # a restarting child: ask again soon
        return reply if reply is not None and reply.info.get("path", "?") != "?" else None
    return wait_until(ask, 10, what=f"{path} to answer")


def pids(head):
    return {c: pong(head, f"work/{c}").pid for c in "abc"}


@pytest.mark.parametrize("strategy,how,expect_restarted", [
    ("one_for_one", "kill", {"b"}),
    ("one_for_one", "raise", {"b"}),
    ("rest_for_one", "kill", {"b", "c"}),
    ("one_for_all", "raise", {"a", "b", "c"}),
])
def test_strategy_restarts_the_right_children_with_their_state(make_head, strategy, how, expect_restarted):
    head = make_head(strategy)
    before = pids(head)
    if how == "kill":
        os.kill(before["b"], signal.SIGKILL)
    else:
        head.asys.tell(head.lookup("work/b"), m.Crash())
    wait_until(lambda: pong(head, "work/b").pid != before["b"], 10, what="b restarted")
    time.sleep(0.3)
    after = pids(head)
    restarted = {c for c in "abc" if after[c] != before[c]}
    assert restarted == expect_restarted
    for value, child in enumerate("abc", start=1):
        assert pong(head, f"work/{child}").info["args"]["value"] == value   # spec state is back
    assert head.status()["restarts"].get("root/work/b") == 1


def test_restart_intensity_escalates_to_the_parent(make_head):
    head = make_head("one_for_one", max_restarts=1)
    first = pids(head)
    for _ in range(2):
        old = pong(head, "work/a").pid
        head.asys.tell(head.lookup("work/a"), m.Crash())
        wait_until(lambda: pong(head, "work/a").pid != old, 10, what="a restarted")
    # The second crash exceeds 1 restart in 30 s: "work" gave up and root restarted it.
    counts = wait_until(lambda: head.status()["restarts"].get("root/work") and head.status()["restarts"],
                        10, what="root to restart the escalated subtree")
    assert counts["root/work"] == 1
    after = pids(head)
    assert all(after[c] != first[c] for c in "abc")   # a fresh subtree


def test_root_escalation_stops_the_head_with_a_clear_message(swarm, tmp_path, trees):
    tree = tmp_path / "fragile.toml"
    tree.write_text('id = "root"\nmax_restarts = 0\n[[children]]\nid = "registry"\nkind = "registry"\nregistry = true\n'
                    '[[children]]\nid = "p"\nkind = "probe"\n')
    head, port, _ = swarm.head(tmp_path / "run", str(tree))
    from actorjet.runtime.head import attach_root, lookup
    asys, root = attach_root(port)
    asys.tell(lookup(asys, root, "p"), m.Crash())
    assert head.wait_exit(30) == 3
    assert "root supervisor gave up" in head.output
    wait_until(lambda: not swarm.kill_system(port), 10, what="head system gone")



def test_transient_child_that_finishes_is_not_restarted_but_one_that_crashes_is(make_head):
    from actorjet.runtime.probe import Finish
    head = make_head(restart_a="transient")                        # a: transient, b: permanent
    crashed = pong(head, "work/a").pid
    head.asys.tell(head.lookup("work/a"), m.Crash())               # a failure: restarted
    wait_until(lambda: pong(head, "work/a").pid != crashed, 10, what="a restarted after its crash")
    permanent = pong(head, "work/b").pid
    head.asys.tell(head.lookup("work/b"), Finish())                # permanent: restarted even so
    wait_until(lambda: pong(head, "work/b").pid != permanent, 10, what="b restarted after finishing")
    finished = pong(head, "work/a").pid
    head.asys.tell(head.lookup("work/a"), Finish())                # transient and finished: stays down
    wait_until(lambda: head.lookup("work/a") is None, 10, what="a gone after finishing")
    wait_until(lambda: not _alive(finished), 10, what="a's process to exit")
    time.sleep(1.0)               # an absence: a restart (no backoff on a first one) would be here by now
    assert head.lookup("work/a") is None
    assert head.status()["restarts"].get("root/work/a") == 1        # the crash only


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_answer_nobody_waited_for_neither_misleads_the_next_ask_nor_is_lost_to_poll(make_head):
    """runtime/system.py ask: a message that reached the head's process unasked (here a lookup
    answer; in life a late Pong, or the root's Escalated) is set aside for poll, and the next
    ask still gets its own answer."""
    head = make_head()
    head.asys.tell(head.root, m.Lookup("registry"))            # its answer comes to nobody's ask
    time.sleep(0.5)
    assert "runners" in head.status()                          # a Status, not that LookupResult
    early = head.poll(1)
    assert isinstance(early, m.LookupResult) and early.path == "registry", early
    assert head.poll(0.2) is None


def test_an_actor_whose_stop_waits_is_gone_within_seconds_of_a_sigterm(make_head):
    """A SIGTERM to every process (``pkill``, a container stop) starts thespian's orderly exit,
    which can wait far longer than a service manager does: a server's requests in flight, a
    parent waiting for its children.  The process is gone SIGTERM_EXIT_S later all the same
    (runtime/lineage.py): here b's stop would take a minute, and b's supervisor waits for b."""
    import psutil

    from actorjet.runtime.lineage import SIGTERM_EXIT_S
    from actorjet.runtime.probe import HoldStop

    head = make_head()
    b = pong(head, "work/b").pid
    parent = pong(head, "work").pid
    assert system.ask(head.asys, head.lookup("work/b"), HoldStop(60.0), HoldStop, 5) is not None
    procs = [psutil.Process(b), psutil.Process(parent)]
    signalled = time.monotonic()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    wait_until(lambda: not any(system.still_running(p) for p in procs), 10, interval_s=0.05, what="b and its supervisor to exit")
    took = time.monotonic() - signalled
    assert took < SIGTERM_EXIT_S + 1.5, took
    wait_until(lambda: pong(head, "work/b").pid != b, 20, what="the root to restart the subtree")



def test_an_actor_process_leaves_the_heap_it_inherited_to_no_collection(make_head):
    """Every actor is a fork of a process that imported the world (here pytest's, with torch).
    A full collection walking those objects took ~0.2 s in a gateway, and wrote to pages the
    process could have shared (runtime/heap.py): each managed actor freezes them as it starts."""
    head = make_head()
    collector = pong(head, "work/a").info["gc"]
    assert collector["frozen"] > 50_000 and collector["young_threshold"] == 700, collector   # Python's own
