#!/usr/bin/env python3
"""Reads a .safetensors file as the format's own readers do (8-byte
little-endian header length, JSON header, then the bytes; parsed here with
struct + json + numpy, or struct + array without numpy, so the `safetensors`
package is not needed) and checks every tensor against the formula
examples/sharded_checkpoint.cpp fills it with: element i is i * 0.25 - 3
(F32), i / 3 (F64) or i * 1000003 - 2^40 (I64). Exits 1 naming the first
tensor that differs.

    read_safetensors.py FILE NAME:DTYPE:D0xD1... [NAME:DTYPE:SHAPE ...] [KEY=VALUE ...]

KEY=VALUE: the header's __metadata__ must hold KEY with VALUE.
"""
import json
import struct
import sys

try:
    import numpy
except ImportError:  # the standard library alone
    numpy = None

FORMATS = {"F32": ("<f", 4), "F64": ("<d", 8), "I64": ("<q", 8)}


def expected(dtype, count):
    if dtype == "F32":
        return [struct.unpack("<f", struct.pack("<f", i * 0.25 - 3.0))[0] for i in range(count)]
    if dtype == "F64":
        return [i / 3.0 for i in range(count)]
    return [i * 1000003 - (1 << 40) for i in range(count)]


def values(data, dtype, count):
    fmt, size = FORMATS[dtype]
    if numpy is not None:
        return numpy.frombuffer(data, dtype=numpy.dtype(fmt), count=count).tolist()
    return list(struct.unpack("<%d%s" % (count, fmt[1]), data[: count * size]))


def main(argv):
    path = argv[1]
    wanted = [a for a in argv[2:] if not a.startswith("--") and "=" not in a]
    metadata = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
    with open(path, "rb") as f:
        blob = f.read()
    (header_length,) = struct.unpack("<Q", blob[:8])
    if header_length % 8 != 0 or 8 + header_length > len(blob):
        sys.exit("%s: header length %d is not a multiple of 8 inside the file" % (path, header_length))
    header = json.loads(blob[8 : 8 + header_length].decode("utf-8"))
    data = blob[8 + header_length :]
    for key, value in metadata.items():
        got = header.get("__metadata__", {}).get(key)
        if got != value:
            sys.exit("metadata %s is %r but must be %r" % (key, got, value))
    for spec in wanted:
        name, dtype, shape_text = spec.split(":")
        shape = [int(d) for d in shape_text.split("x")] if shape_text else []
        entry = header.get(name)
        if entry is None:
            sys.exit("%s: no tensor %s (has %s)" % (path, name, sorted(header)))
        if entry["dtype"] != dtype or entry["shape"] != shape:
            sys.exit("%s is %s %s but must be %s %s" % (name, entry["dtype"], entry["shape"], dtype, shape))
        begin, end = entry["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * FORMATS[dtype][1] or end > len(data):
            sys.exit("%s: data_offsets [%d, %d) do not fit %d elements in %d bytes" % (name, begin, end, count, len(data)))
        got = values(data[begin:end], dtype, count)
        want = expected(dtype, count)
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                sys.exit("%s: element %d is %r but must be %r" % (name, i, g, w))
        print("ok: %s %s %s, %d values equal (%s)" % (name, dtype, shape, count, "numpy" if numpy else "struct"))
    print("OK: %d tensors read back from %s" % (len(wanted), path))


if __name__ == "__main__":
    main(sys.argv)
