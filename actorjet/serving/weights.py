"""Weight versions as files: one memory copy on each side, and never half a version.

A learner publishes version v by writing a safetensors file next to its engine (they share a
node: the model's subtree).  ``safetensors.save_file`` builds the whole file in memory and then
writes it, and ``load_file`` + ``load_state_dict`` copy twice more: ~1.3 s for SmolLM2-135M.
Here each tensor's bytes go straight from the learner's memory into the file (``pwrite``) and
straight from the file into the engine's own parameter (``preadv``): one kernel copy each
way, through the page cache, which is the shared memory.  The files stay ordinary
safetensors that any tool reads.

Allocating fresh page-cache pages costs as much as the copy itself, so the learner recycles
the file of the version three back (``recycle``): it is renamed away and overwritten in place.
An engine still reading that old file (it would have to be two versions behind) sees its
header change under it; ``load_into`` checks the header again after the copy and reports a
torn read, and the engine loads the newest version instead.

A version becomes visible only whole: it is written under ``*.partial`` and renamed when
complete (an atomic rename on one filesystem), so a learner killed mid-publish leaves no file
an engine would load, and the engine keeps serving the version it has.

Where only some tensors train (a LoRA adapter), only those are published: the file is the
adapter, a few MB.

An engine on another node than its learner (the tree places them apart) cannot read the
learner's files: serving/engine_wire.py ``push``es the finished file to it over HTTP, and the
engine's ``Receiver`` writes it into the engine's node directory under the same rules
(partial until whole), before the learner sends ``LoadWeights`` with the engine's own path.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import torch


DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
TORCH = {name: dtype for dtype, name in DTYPES.items()}
PARTIAL = ".partial"
CHUNK = 64 << 20        # bytes per system call


class TornRead(OSError):
    """The file was recycled for a newer version while it was being read."""


def _bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes without a copy (CPU, contiguous)."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:done + CHUNK], offset + done)


def _pread(fd: int, into: memoryview, offset: int) -> None:
    done = 0
    while done < len(into):
        n = os.preadv(fd, [into[done:done + CHUNK]], offset + done)
        if n == 0:
            raise TornRead(f"the file ended at byte {offset + done}: it was cut while read")
        done += n


def published_versions(folder: Path) -> list[int]:
    """The versions a learner published in ``folder``; a partial file (a publish its learner was
    killed in) is removed."""
    for partial in folder.glob(f"*{PARTIAL}"):
        partial.unlink(missing_ok=True)
    return [int(p.stem[1:]) for p in folder.glob("v*.safetensors")]


def publish_version(folder: Path, version: int, tensors: dict[str, torch.Tensor], keep: int = 3) -> tuple[Path, int]:
    """A learner's weight version ``folder/vNNNNNN.safetensors``; the version ``keep`` older is
    overwritten in place when it has the same size (else removed): engines and a rewinding
    learner never need more.  Returns the file and its bytes."""
    path, old = folder / f"v{version:06d}.safetensors", folder / f"v{version - keep:06d}.safetensors"
    size = publish(tensors, path, {"version": f"{version:012d}"}, recycle=old)
    old.unlink(missing_ok=True)                  # not recycled
    return path, size


def publish(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None,
            recycle: str | Path | None = None) -> int:
    """Write ``tensors`` to ``path`` (safetensors) with one copy each; returns the file's bytes.
    Tensors that share storage (tied embeddings) are written once, under the first name.
    ``recycle``: an older version's file to overwrite in place when it has the same size."""
    path = Path(path)
    seen, items = set(), []
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        items.append((name, t))
    # largest elements first: every tensor then starts at a multiple of its element size
    items.sort(key=lambda kv: (-kv[1].element_size(), kv[0]))
    header, offset = {}, 0
    for name, t in items:
        size = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)             # the data starts 8-byte aligned
    start = 8 + len(raw)
    partial = path.with_name(path.name + PARTIAL)
    if recycle is not None and Path(recycle).exists() and Path(recycle).stat().st_size == start + offset:
        os.replace(recycle, partial)                 # its pages are reused: no fresh allocation
    else:
        partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, start + offset)
        _pwrite(fd, memoryview(struct.pack("<Q", len(raw)) + raw), 0)    # the header first: see load_into
        for name, t in items:
            t = t.detach()
            if t.device.type != "cpu" or not t.is_contiguous():
                t = t.to("cpu").contiguous()
            _pwrite(fd, _bytes(t), start + header[name]["data_offsets"][0])
    except BaseException:          # a full disk: the partial file's pages go back
        os.close(fd)
        partial.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(partial, path)
    return start + offset


def load_into(targets: dict[str, torch.Tensor], path: str | Path) -> int:
    """Copy every tensor of the file at ``path`` into the tensor of the same name in
    ``targets`` (a model's ``state_dict()``: its tensors share the parameters' storage).
    A name the targets lack, or a shape that differs, is an error: the learner and this
    engine do not hold the same model.  ``TornRead`` if the file was recycled meanwhile
    (the targets then hold a mix: load a whole version next).  Returns the bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        raw = os.pread(fd, n, 8)
        header, start = json.loads(raw), 8 + n
        header.pop("__metadata__", None)
        missing = [name for name in header if name not in targets]
        if missing:
            raise ValueError(f"{path}: {len(missing)} tensors this model does not have, e.g. {missing[0]!r}")
        with torch.no_grad():
            for name, h in header.items():
                dst, dtype = targets[name], TORCH[h["dtype"]]
                if tuple(dst.shape) != tuple(h["shape"]):
                    raise ValueError(f"{path}: {name} has shape {tuple(h['shape'])}, this model's {tuple(dst.shape)}")
                direct = dst.device.type == "cpu" and dst.is_contiguous() and dst.dtype == dtype
                into = dst if direct else torch.empty(h["shape"], dtype=dtype)
                _pread(fd, _bytes(into), start + h["data_offsets"][0])
                if not direct:
                    dst.copy_(into)
        if os.pread(fd, 8 + n, 0) != struct.pack("<Q", n) + raw:
            raise TornRead(f"{path} was recycled for a newer version while it was read")
    finally:
        os.close(fd)
    return start + max((h["data_offsets"][1] for h in header.values()), default=0)


def newest(folder: str | Path) -> Path | None:
    """The newest complete version in ``folder`` (``vNNNNNN.safetensors``; never a partial one)."""
    return max(Path(folder).glob("v*.safetensors"), default=None)


# -- across nodes: streamed in buckets ----------------------------------------------------------
NAME = re.compile(r"^v\d{6}\.safetensors$")
FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")      # a model name; never "." or ".."
