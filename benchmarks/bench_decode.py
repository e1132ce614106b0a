"""``wirekit decode`` throughput on a generated 200k-message MIP file, beside plain baselines.

Run as a script (not collected by pytest)::

    python benchmarks/bench_decode.py [--messages N] [--python OTHER_PYTHON] [--keep FILE]

It writes a file of concatenated MIP messages (requests and responses, TEXT/JSON/IMAGE
items, ~75 MB for 200k messages), then times, in one run and on that one file:

* ``codec``: ``mip.decode_prefix`` over the whole file (no output);
* ``struct+json``: a naive loop with ``struct`` that hex-encodes items and ``json.dumps``
  a dict per message (what a user would write by hand);
* ``decode human`` / ``decode --json``: the ``wirekit decode`` command, output to /dev/null,
  as a separate process (the time a user waits);
* with ``--python``, the same two commands run by another interpreter (an older checkout) to
  give before/after ratios.

It prints seconds and messages per second, and the ratios.  No thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

HEADER = struct.Struct(">BBBBI")
INFERENCE_HEAD = struct.Struct(">BBH")
ITEM_HEAD = struct.Struct(">II")


def generate(path: str, count: int) -> int:
    """Write ``count`` MIP messages to ``path``; return the file size."""
    from wirekit import mip

    msgs = []
    for k in range(8):
        text = mip.Item.text(f"sample {k}: the quick brown fox jumps over the lazy dog " * 2)
        js = mip.Item.json({"id": k, "values": list(range(20)), "tag": "x" * 30})
        img = mip.Item.image(bytes((k * 7 + i) % 256 for i in range(400)))
        msgs.append(mip.encode(mip.Inference.request([[text, js]] * 2)))
        msgs.append(mip.encode(mip.Inference.reply([[img]], n_input=2)))
    msgs.append(mip.encode(mip.Ping()))
    msgs.append(mip.encode(mip.Ping(True)))
    size = 0
    with open(path, "wb") as fh:
        for i in range(count):
            wire = msgs[i % len(msgs)]
            fh.write(wire)
            size += len(wire)
    return size


def codec_only(path: str) -> int:
    from wirekit import mip

    with open(path, "rb") as fh:
        data = fh.read()
    pos = n = 0
    while pos < len(data):
        _msg, pos = mip.decode_prefix(data, pos)
        n += 1
    return n


def struct_json(path: str) -> int:
    """The naive baseline: struct to parse, a dict per message, json.dumps, written out."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos = n = 0
    with open(os.devnull, "w") as out:
        while pos < len(data):
            _v, kind, subtype, _r, remaining = HEADER.unpack_from(data, pos)
            rec = {"offset": pos, "kind": kind, "subtype": subtype}
            if kind == 2:
                n_in, n_out, batch = INFERENCE_HEAD.unpack_from(data, pos + 8)
                p = pos + 12
                items = []
                for _ in range(batch * (n_out if subtype else n_in)):
                    t, size = ITEM_HEAD.unpack_from(data, p)
                    body = data[p + 8 : p + 8 + size]
                    items.append({"type": t, "size": size, "data_hex": body.hex()})
                    p += 8 + size
                rec["items"] = items
            out.write(json.dumps(rec) + "\n")
            pos += 8 + remaining
            n += 1
    return n


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def command(python: str, path: str, *extra: str) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(
            [python, "-m", "wirekit.cli", "decode", "--proto", "mip", *extra, path],
            stdout=sink, check=False, cwd=tempfile.gettempdir(),
        )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--python", help="another interpreter (an older wirekit) to compare")
    parser.add_argument("--keep", help="write the generated file here and keep it")
    args = parser.parse_args()
    path = args.keep or os.path.join(tempfile.mkdtemp(), "mip-200k.bin")
    size = generate(path, args.messages)
    n = args.messages
    rows = {
        "codec": timed(codec_only, path),
        "struct+json": timed(struct_json, path),
        "decode human": command(sys.executable, path),
        "decode --json": command(sys.executable, path, "--json"),
    }
    if args.python:
        rows["old decode human"] = command(args.python, path)
        rows["old decode --json"] = command(args.python, path, "--json")
    print(f"{n} messages, {size / 1e6:.1f} MB")
    for name, sec in rows.items():
        print(f"  {name:<18} {sec:7.2f} s  {n / sec / 1000:8.1f} k msg/s")
    print(f"  codec share of decode --json: {rows['codec'] / rows['decode --json']:.0%}")
    print(f"  struct+json / decode --json: {rows['struct+json'] / rows['decode --json']:.2f}x")
    if args.python:
        for form in ("human", "--json"):
            old, new = rows[f"old decode {form}"], rows[f"decode {form}"]
            print(f"  speed-up {form}: {old / new:.2f}x")
    if not args.keep:
        os.unlink(path)


if __name__ == "__main__":
    main()
