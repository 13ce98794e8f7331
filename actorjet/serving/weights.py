"""Weight versions as files: one memory copy on each side, and never half a version.

A learner publishes version v by writing a safetensors file next to its engine (they share a
node: the model's subtree).  ``safetensors.save_file`` builds the whole file in memory and then
writes it, and ``load_file`` + ``load_state_dict`` copy twice more: ~1.5 s for SmolLM2-135M's
650 MB.  Here the file is sized first and memory-mapped, each tensor is copied once straight
into its place (the learner), and the engine maps the finished file and copies each tensor
once into its own parameter.  Both sides run at memory-copy speed; the page cache is the
shared memory, and the files stay ordinary safetensors that any tool reads.

A version becomes visible only whole: it is written under ``*.partial`` and renamed when
complete (an atomic rename on one filesystem), so a learner killed mid-publish leaves no file
an engine would load, and the engine keeps serving the version it has.

Where only some tensors train (a LoRA adapter), only those are published: the file is the
adapter, a few MB.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
TORCH = {name: dtype for dtype, name in DTYPES.items()}
PARTIAL = ".partial"


def publish(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` to ``path`` (safetensors) with one copy each; returns the file's bytes.
    Tensors that share storage (tied embeddings) are written once, under the first name."""
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
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(start + offset)
    if offset:
        buf = torch.from_file(str(partial), shared=True, size=start + offset, dtype=torch.uint8)
        with torch.no_grad():
            for name, t in items:
                a, b = header[name]["data_offsets"]
                buf[start + a:start + b].view(t.dtype).view(t.shape).copy_(t.detach())
        del buf                                       # unmapped: the pages are the file's now
    os.replace(partial, path)
    return start + offset


def read_header(path: str | Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def load_into(targets: dict[str, torch.Tensor], path: str | Path) -> int:
    """Copy every tensor of the file at ``path`` into the tensor of the same name in
    ``targets`` (a model's ``state_dict()``: its tensors share the parameters' storage).
    A name the targets lack, or a shape that differs, is an error: the learner and this
    engine do not hold the same model.  Returns the bytes read."""
    header, start = read_header(path)
    header.pop("__metadata__", None)
    missing = [name for name in header if name not in targets]
    if missing:
        raise ValueError(f"{path}: {len(missing)} tensors this model does not have, e.g. {missing[0]!r}")
    size = start + max((h["data_offsets"][1] for h in header.values()), default=0)
    buf = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)    # a private map: no copy yet
    with torch.no_grad():
        for name, h in header.items():
            a, b = h["data_offsets"]
            src = buf[start + a:start + b].view(TORCH[h["dtype"]]).view(h["shape"])
            dst = targets[name]
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(f"{path}: {name} has shape {tuple(src.shape)}, this model's {tuple(dst.shape)}")
            dst.copy_(src)
    return size


def newest(folder: str | Path) -> Path | None:
    """The newest complete version in ``folder`` (``vNNNNNN.safetensors``; never a partial one)."""
    return max(Path(folder).glob("v*.safetensors"), default=None)
