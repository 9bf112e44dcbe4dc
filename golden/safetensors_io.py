# Reading and writing safetensors files with the standard library and torch only (no
# `safetensors` package): an 8-byte little-endian header length, a JSON header
# {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then
# the tensors' bytes, little-endian, row-major (https://github.com/huggingface/safetensors).
# Every malformed file is a GoldenError naming the file and what is wrong, never a crash.
import json
import struct

import torch

from errors import GoldenError

# safetensors dtype name <-> torch dtype (the ones mih writes and a checkpoint holds).
_DTYPES = {
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
_NAMES = {v: k for k, v in _DTYPES.items()}
# A header beyond this is not a tensor file (safetensors itself caps it at 100 MB).
_MAX_HEADER = 100 * 1024 * 1024


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def read(path):
    """Returns ({name: tensor}, metadata) of safetensors file `path` (tensors on the CPU, in
    the file's dtypes). Raises GoldenError(11) for a missing, truncated or malformed file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GoldenError(11, "cannot read %s: %s" % (path, e.strerror or e))
    if len(data) < 8:
        raise GoldenError(11, "%s is not a safetensors file: %d bytes, shorter than its 8-byte header length"
                          % (path, len(data)))
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise GoldenError(11, "%s: header length %d does not fit the file's %d bytes (truncated, or not "
                              "safetensors)" % (path, n, len(data)))
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise GoldenError(11, "%s: the header is not JSON (%s)" % (path, e))
    if not isinstance(header, dict):
        raise GoldenError(11, "%s: the header is a JSON %s, expected an object" % (path, type(header).__name__))
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    covered = []
    for name, entry in header.items():
        where = "%s: tensor '%s'" % (path, name)
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise GoldenError(11, "%s: expected {dtype, shape, data_offsets}, got %r" % (where, entry))
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise GoldenError(11, "%s: dtype %r is not one of %s" % (where, entry["dtype"], ", ".join(_DTYPES)))
        shape = entry["shape"]
        offsets = entry["data_offsets"]
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise GoldenError(11, "%s: malformed shape %r or data_offsets %r" % (where, shape, offsets))
        begin, end = offsets
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(body) or end - begin != numel * _element_size(dtype):
            raise GoldenError(11, "%s: data_offsets [%d, %d] do not hold %s of %s (%d bytes of data in the file)"
                              % (where, begin, end, shape, entry["dtype"], len(body)))
        covered.append((begin, end))
        raw = bytes(body[begin:end])
        t = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape).clone()
    covered.sort()
    for (b0, e0), (b1, _) in zip(covered, covered[1:]):
        if b1 < e0:
            raise GoldenError(11, "%s: two tensors overlap at byte %d of the data" % (path, b1))
    return tensors, metadata


def write(path, tensors, metadata=None):
    """Writes {name: tensor} to `path` (sorted by name, each contiguous on the CPU, the header
    padded with spaces to a multiple of 8 bytes as the reference writer does)."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _NAMES:
            raise GoldenError(11, "cannot write tensor '%s' of dtype %s to %s" % (name, t.dtype, path))
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
