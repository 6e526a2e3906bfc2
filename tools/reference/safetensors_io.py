#!/usr/bin/python3
"""Minimal safetensors writer/reader in pure Python + torch (no safetensors package).

File layout (https://github.com/huggingface/safetensors):
  * 8 bytes: little-endian u64 N = length of the JSON header in bytes
  * N bytes: UTF-8 JSON header
        {"__metadata__": {"format": "pt"},
         "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
    padded with trailing spaces so that 8 + N is a multiple of 8
  * raw little-endian tensor data; offsets are relative to the start of this
    byte buffer (i.e. right after the header).

The writer stores tensors in sorted-name order, contiguously, with no gaps, and
emits the header keys in that same order (metadata first), so the output is a
deterministic function of the input tensors.
"""
import json
import struct
import sys

import torch

# safetensors dtype tag <-> torch dtype
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
TAGS = {v: k for k, v in DTYPES.items()}

if sys.byteorder != "little":  # raw torch bytes are native-endian
    raise RuntimeError("safetensors_io.py assumes a little-endian host")


try:  # numpy is optional; it only makes byte extraction faster
    import numpy  # noqa: F401
    _HAVE_NUMPY = True
except Exception:  # pragma: no cover
    _HAVE_NUMPY = False


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw native (little-endian) bytes of a tensor, row-major contiguous."""
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    u8 = t.reshape(-1).view(torch.uint8)  # reinterpret, works for bf16 too
    if _HAVE_NUMPY:
        return u8.numpy().tobytes()
    return bytes(u8.tolist())


def save_file(tensors: dict, path: str, metadata: dict = None) -> None:
    """Write {name: tensor} to `path` in safetensors format (sorted names)."""
    header = {"__metadata__": dict(metadata) if metadata else {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in TAGS:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        b = _tensor_bytes(t)
        assert len(b) == t.numel() * t.element_size()
        header[name] = {
            "dtype": TAGS[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    pad = (8 - (8 + len(hjson)) % 8) % 8
    hjson += b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_file(path: str, with_metadata: bool = False):
    """Read a safetensors file into {name: tensor} (CPU, owned memory)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("file too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError("header length past end of file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        dt = DTYPES[info["dtype"]]
        shape = list(info["shape"])
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"{name}: bad data_offsets {b},{e}")
        numel = 1
        for s in shape:
            numel *= s
        esize = torch.empty((), dtype=dt).element_size()
        if e - b != numel * esize:
            raise ValueError(f"{name}: size mismatch ({e - b} bytes for {shape} {info['dtype']})")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dt)
            continue
        buf = bytearray(data[b:e])  # writable copy -> tensor owns its memory
        out[name] = torch.frombuffer(buf, dtype=torch.uint8).view(dt).reshape(shape).clone()
    if with_metadata:
        return out, meta
    return out


if __name__ == "__main__":
    # Usage: safetensors_io.py FILE  -> prints name, dtype, shape of every tensor
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    ts, md = load_file(sys.argv[1], with_metadata=True)
    print("metadata:", md)
    for k in sorted(ts):
        print(f"{k} {TAGS[ts[k].dtype]} {list(ts[k].shape)}")
