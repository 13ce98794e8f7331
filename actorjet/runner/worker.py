"""Task workers: one OS process per task inside a runner, so tasks cannot hurt each other.

With ``isolation = "process"`` a runner runs each task's episodes in that task's own
worker process (a thread pool inside it, since episodes mostly wait on HTTP).  If a
task's environment kills its process, exhausts it or leaks past ``task_memory_mb``, only
that worker dies: its episodes in flight fail (and are retried by the registry), the next
episode of the task starts a fresh worker, and every other task's episodes keep running.

Parent ↔ worker: a multiprocessing pipe carrying (episode id, payload, task, urls, episode)
one way and (episode id, result) the other.  Workers are forked from a fork server (see
_context): never from the threaded runner itself.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import psutil

from actorjet.rl.rewards import failed
from actorjet.runtime.backoff import Backoff


def _worker_main(conn, threads: int) -> None:
    from actorjet.runner.episode import load_behavior, run_episode
    from actorjet.runtime.heap import freeze_inherited

    freeze_inherited()            # the fork server's imports (the openai SDK's models) stay put
    loaded: dict[tuple, object] = {}
    lock = threading.Lock()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="episode")

    def run(key, payload, task, urls, episode):
        fn = loaded.get((payload["name"], payload["version"]))
        if fn is None:
            fn, error, _ = load_behavior(payload)
            if fn is None:
                result = failed(episode["episode_id"], error)
                with lock:
                    conn.send((key, result))
                return
            loaded[(payload["name"], payload["version"])] = fn
        result = run_episode(fn, task, urls, episode)
        with lock:
            conn.send((key, result))

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        pool.submit(run, *msg)


_CTX = None


def _context():
    """Workers come from a fork server: forking the threaded runner itself is unsafe, and
    spawning a fresh interpreter per restart costs ~1 s of CPU, which a task in a crash loop
    would take from every other task.  The server imports the runner code once; each worker
    is a cheap fork of it."""
    global _CTX
    if _CTX is None:
        _short_socket_dir()
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["actorjet.runner.episode", "openai"])
    return _CTX


SOCKET_PATH_MAX = 100      # a unix socket's path is at most 107 bytes on Linux (sun_path)


def _short_socket_dir() -> None:
    """The fork server listens on a unix socket in multiprocessing's temp dir, made under
    TMPDIR.  Under a long TMPDIR (a CI runner's, a test's) its path passed the 107-byte limit:
    every worker start failed with "AF_UNIX path too long", the runner crashed and was
    restarted forever, and the task never trained.  Python 3.11 has no fallback, so the dir
    multiprocessing caches for this process is made under /tmp instead; agent code still
    sees its own TMPDIR."""
    import tempfile

    from multiprocessing import util

    room = len(tempfile.gettempdir()) + len("/pymp-xxxxxxxx/listener-xxxxxxxx")
    if room <= SOCKET_PATH_MAX or not os.access("/tmp", os.W_OK):
        return
    before, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        util.get_temp_dir()          # made now and cached: the fork server's socket goes there
    finally:
        tempfile.tempdir = before


class TaskWorker:
    def __init__(self, task_name: str, threads: int):
        self.task_name, self.threads = task_name, threads
        self.process = None
        self.conn = None
        self.futures: dict[str, Future] = {}
        self.lock = threading.Lock()
        self.restarts = 0
        self.queue: list = []              # requests not yet sent (worker down or backing off)
        self.backoff = Backoff(initial_s=0.25, max_s=10.0, healthy_s=30.0)   # runtime/backoff.py
        self.started = 0.0
        self.not_before = 0.0
        self.timer_armed = False

    def _start(self) -> None:
        ctx = _context()
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, self.threads), daemon=True,
                                   name=f"actorjet-task-{self.task_name}")
        self.process.start()
        self.started = time.monotonic()
        child.close()
        self.conn = parent
        threading.Thread(target=self._read, args=(parent, self.process), daemon=True).start()

    def submit(self, payload: dict, task: dict, urls: dict, episode: dict) -> Future:
        future: Future = Future()
        with self.lock:
            self.futures[episode["episode_id"]] = future
            self.queue.append((episode["episode_id"], payload, task, urls, episode))
            self._pump()
        return future

    def _pump(self) -> None:
        """Start the worker if it is down (unless it is backing off) and send what waits.
        A task that keeps killing its worker (within 30 s of its start) is restarted after
        growing pauses (0.25 s, 0.5 s, … up to 10 s; runtime/backoff.py): each start costs a Python process, and a crash loop must not
        eat the CPU the other tasks need.  Its episodes wait meanwhile (their lease runs)."""
        alive = self.process is not None and self.process.is_alive()
        if not alive:
            delay = self.not_before - time.monotonic()
            if delay > 0:
                if not self.timer_armed:
                    self.timer_armed = True
                    timer = threading.Timer(delay, self._after_backoff)
                    timer.daemon = True
                    timer.start()
                return
            if self.process is not None:
                self.restarts += 1
            self._start()
        while self.queue:
            item = self.queue.pop(0)
            try:
                self.conn.send(item)
            except (OSError, BrokenPipeError):
                self._fail_all(f"task worker for {self.task_name} is gone")
                return

    def _after_backoff(self) -> None:
        with self.lock:
            self.timer_armed = False
            if self.queue:
                self._pump()

    def _died(self) -> None:
        now = time.monotonic()
        self.not_before = now + self.backoff.delay(self.task_name, self.started, now)

    def _read(self, conn, process) -> None:
        while True:
            try:
                key, result = conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                future = self.futures.pop(key, None)
            if future is not None:
                future.set_result(result)
        process.join(1.0)
        with self.lock:
            if self.process is process:
                self._died()
                self._fail_all(f"task worker for {self.task_name} died (exit code {process.exitcode})")

    def _fail_all(self, error: str) -> None:
        self.queue = [q for q in self.queue if q[0] not in self.futures]
        for episode_id, future in list(self.futures.items()):
            future.set_result(failed(episode_id, f"worker died: {error}"))
        self.futures.clear()

    def rss_mb(self) -> float:
        try:
            return psutil.Process(self.process.pid).memory_info().rss / 2**20 if self.process else 0.0
        except psutil.Error:
            return 0.0

    def kill(self, reason: str) -> None:
        """Stop this task's worker (e.g. over its memory limit): only its own episodes fail."""
        with self.lock:
            process = self.process
            if process is not None and process.is_alive():
                self._fail_all(reason)
                process.kill()
                # Gone before the lock is let go: a request submitted next must start a new
                # worker, not go down the pipe of this dying one (and be failed with it).
                process.join(5.0)
                self._died()
                self.process = None

    def close(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
