"""What publishing one weight version costs, learner side plus engine side, on SmolLM2-135M.

    python bench/weightsync.py [--repeats 5] [--dir /tmp] [--model smollm2-135m]

(``--smoke`` runs every path on tiny-arith's 4 MB, in seconds, so the bench cannot rot.)

  before      what the learner did until 8ad92f6: clone every tensor, ``safetensors.save_file``
              (the whole file built in memory, then written); the engine ``load_file`` +
              ``load_state_dict``
  full        serving/weights.py: each tensor's bytes written once into the file (pwrite),
              recycling the file of the version three back; the engine reads each tensor
              once into its own parameter (preadv)
  full /dev/shm  the same, the version files on tmpfs instead of the run directory
  lora r=16   the same path with a LoRA adapter (all-linear): a version is the adapter
  across nodes  the full file pushed (serving/engine_wire.py ``push``) from one network namespace
              to an engine's HTTP endpoint in another, over veth, against raw TCP
              (``socket.sendfile`` into a receiver that discards) of the same bytes (root only)

Each publish writes version v and drops (before) or recycles (after) the file of v-3, as
the learner does; the first three rounds are not timed.  "memcpy" is one copy of the same bytes between two tensors on this machine:
a file-based publish does at least two (learner → file, file → engine), so 2x memcpy is the
floor of this design.  Medians over ``--repeats``.  Writes bench/results/weightsync.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import parse, table, write  # noqa: E402

from actorjet.rl import lora  # noqa: E402
from actorjet.serving import weights  # noqa: E402
from actorjet.models import zoo  # noqa: E402


def old_publish(model, path: Path, recycle: Path) -> int:
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}, str(path))
    recycle.unlink(missing_ok=True)
    return path.stat().st_size


def old_load(model, path: Path) -> None:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)), strict=False)


def new_publish(tensors):
    return lambda model, path, recycle: weights.publish(tensors(model), path, {"version": path.stem}, recycle)


def new_load(model, path: Path) -> None:
    weights.load_into(model.state_dict(), path)


def measure(name: str, learner, engine, publish, load, folder: Path, repeats: int) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    pub, rd, size = [], [], 0
    for v in range(1, repeats + 4):            # the first three rounds fill the ring of files
        with torch.no_grad():
            for p in learner.parameters():
                if p.requires_grad:
                    p.add_(1e-6)                # a new version: the bytes change
        path = folder / f"v{v:06d}.safetensors"
        t0 = time.perf_counter()
        size = publish(learner, path, folder / f"v{v - 3:06d}.safetensors")
        t1 = time.perf_counter()
        load(engine, path)
        t2 = time.perf_counter()
        if v > 3:
            pub.append(t1 - t0)
            rd.append(t2 - t1)
    for p in folder.glob("v*.safetensors"):
        p.unlink()
    out = {"name": name, "bytes": size, "publish_s": statistics.median(pub), "load_s": statistics.median(rd)}
    out["total_s"] = out["publish_s"] + out["load_s"]
    return out


def memcpy_s(nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    src.normal_()
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


RAW_RECEIVER = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
for _ in range(int(sys.argv[3])):
    conn, _ = srv.accept()
    buf, n = bytearray(1 << 20), 0
    while (k := conn.recv_into(buf)):
        n += k
    conn.close()
    print(n, flush=True)
"""

RAW_SENDER = """
import socket, sys, time
t0 = time.perf_counter()
with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as s, open(sys.argv[3], "rb") as f:
    s.sendfile(f)
print(time.perf_counter() - t0)
"""

PUSH_RECEIVER = """
import sys
from pathlib import Path
from actorjet.serving.engine_wire import Receiver
receiver = Receiver(Path(sys.argv[3]), "tok", sys.argv[1], int(sys.argv[2]))
print("ready", flush=True)
receiver.serve_forever()
"""

PUSH_SENDER = """
import sys, time
from actorjet.serving import engine_wire
t0 = time.perf_counter()
engine_wire.push(sys.argv[3], f"http://{sys.argv[1]}:{sys.argv[2]}", "tok", "policy")
print(time.perf_counter() - t0)
"""


def cross_node(path: Path, repeats: int) -> dict:
    """A push between two network namespaces on veth, against raw TCP of the same bytes."""
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import hosts

    why = hosts.unavailable()
    if why:
        return {"skipped": why}
    net = hosts.Network()
    procs = []
    try:
        learner, engine = net.host("learner"), net.host("engine")
        out = {"bytes": path.stat().st_size}
        for name, receiver, sender, port in (("raw_tcp", RAW_RECEIVER, RAW_SENDER, 7001),
                                             ("push", PUSH_RECEIVER, PUSH_SENDER, 7002)):
            extra = [str(repeats + 4)] if name == "raw_tcp" else [str(path.parent / "received")]
            proc = subprocess.Popen(engine.prefix + [sys.executable, "-c", receiver, engine.ip, str(port)] + extra,
                                    stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            assert proc.stdout.readline().strip() == "ready"
            times = []
            for k in range(repeats + 4):       # versions 1-3 fill the engine's ring of files (not timed)
                version = path.with_name(f"v{k + 1:06d}.safetensors")    # new names, as the learner sends
                if not version.exists():
                    os.link(path, version)
                for _ in range(50):
                    done = subprocess.run(learner.prefix + [sys.executable, "-c", sender, engine.ip, str(port),
                                                            str(version)], capture_output=True, text=True)
                    if done.returncode == 0:
                        break
                    time.sleep(0.1)            # the receiver is not listening yet
                times.append(float(done.stdout.strip().splitlines()[-1]))
            seconds = statistics.median(times[3:])
            out[name] = {"s": seconds, "MBps": out["bytes"] / seconds / 1e6}
        out["push_vs_raw"] = out["raw_tcp"]["s"] / out["push"]["s"]
        return out
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        net.close()


def main() -> None:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where run-directory files go (default: a temp dir)")
    ap.add_argument("--no-cross-node", action="store_true", help="skip the push between two network namespaces")
    ap.add_argument("--model", default="smollm2-135m", help="a zoo model or a local directory (default smollm2-135m)")
    args = parse(ap, {"repeats": 1, "model": "tiny-arith"})
    torch.set_num_threads(1)                     # the learner and the engine each have a core here
    path = zoo.resolve(args.model)
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # noqa: E731
    learner, engine = load(), load()
    base = Path(tempfile.mkdtemp(prefix="weightsync-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="weightsync-", dir="/dev/shm")) if Path("/dev/shm").is_dir() else None
    rows = [measure("before (save_file + load_state_dict)", learner, engine, old_publish, old_load,
                    base / "before", args.repeats),
            measure("full, run dir (page cache)", learner, engine, new_publish(lambda m: m.state_dict()), new_load,
                    base / "full", args.repeats)]
    if shm is not None:
        rows.append(measure("full, /dev/shm", learner, engine, new_publish(lambda m: m.state_dict()), new_load,
                            shm, args.repeats))
        shm.rmdir()
    cfg = lora.check({"r": 16, "alpha": 32}, "bench")
    lora_learner = lora.attach(load(), cfg).get_base_model()
    lora_engine = lora.attach(load(), cfg).get_base_model()
    rows.append(measure("lora r=16 all-linear (adapter)", lora_learner, lora_engine,
                        new_publish(lora.adapter_tensors), new_load, base / "lora", args.repeats))
    sample = base / "net" / "v000001.safetensors"
    sample.parent.mkdir(parents=True, exist_ok=True)
    weights.publish(learner.state_dict(), sample)
    net = cross_node(sample, args.repeats) if not args.no_cross_node else {"skipped": "--no-cross-node"}
    full_bytes = rows[1]["bytes"]
    limit = memcpy_s(full_bytes, args.repeats)
    for r in rows:
        r["memcpy_s"] = limit * r["bytes"] / full_bytes
        r["x_memcpy"] = r["total_s"] / r["memcpy_s"]
    table([(r["name"], f"{r['bytes'] / 1e6:.1f}", f"{r['publish_s']:.3f}", f"{r['load_s']:.3f}",
            f"{r['total_s']:.3f}", f"{r['x_memcpy']:.1f}x") for r in rows],
          ("path", "MB", "learner s", "engine s", "total s", "vs one memcpy"))
    print(f"memcpy of {full_bytes / 1e6:.0f} MB: {limit:.3f} s ({full_bytes / limit / 1e9:.1f} GB/s)")
    if "skipped" in net:
        print(f"across nodes: skipped ({net['skipped']})")
    else:
        print(f"across nodes (two namespaces on veth, {net['bytes'] / 1e6:.0f} MB): raw TCP "
              f"{net['raw_tcp']['MBps']:.0f} MB/s, push {net['push']['MBps']:.0f} MB/s "
              f"({net['push_vs_raw']:.0%} of raw)")
    write("weightsync", {"model": f"{args.model} float32", "repeats": args.repeats, "rows": rows,
                         "memcpy_s": limit, "memcpy_GBps": full_bytes / limit / 1e9,
                         "cross_node": net,
                         "targets": {"full_same_node_s": 0.25, "lora_s": 0.05, "x_memcpy": 3.0,
                                     "push_vs_raw": 0.5}})


if __name__ == "__main__":
    main()
