#!/usr/bin/env python3
"""Reads a `mih export` directory with nothing but the standard library (json + struct), as an
outside tool would: parses the safetensors files by the format's spec, and recomputes the mean
cross entropy of the reference logits over the labels != -100 in pure Python. Exits 0 when it
equals the exported loss (relative 1e-5), printing what it read; 1 otherwise."""
import json
import math
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    fmt = {"F64": "d", "F32": "f", "I64": "q", "I32": "i"}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        code = fmt[entry["dtype"]]
        count = (end - begin) // struct.calcsize(code)
        out[name] = (entry["shape"], struct.unpack("<%d%s" % (count, code), data[base + begin:base + end]))
    return out


def main(directory):
    model = read_safetensors(directory + "/model.safetensors")
    batch = read_safetensors(directory + "/batch.safetensors")
    ref = read_safetensors(directory + "/reference.safetensors")
    (b, s, v), logits = ref["logits"]
    _, labels = batch["labels"]
    total, count = 0.0, 0
    for t in range(b * s):
        if labels[t] == -100:
            continue
        row = logits[t * v:(t + 1) * v]
        m = max(row)
        total += m + math.log(sum(math.exp(x - m) for x in row)) - row[labels[t]]
        count += 1
    loss = total / count
    exported = ref["loss"][1][0]
    print("read %d weight tensors (e.g. %s), logits [%d, %d, %d], %d targets: loss %.6f, exported %.6f"
          % (len(model), sorted(model)[0], b, s, v, count, loss, exported))
    return 0 if abs(loss - exported) <= 1e-5 * abs(exported) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
