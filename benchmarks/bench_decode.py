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

Each is timed ``--repeat`` times (best kept).  It prints seconds, messages per second, the
ratios, and the peak memory (RSS) of the new ``wirekit decode`` processes beside the file
size.  No thresholds.
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


#: Runs ``wirekit decode`` and reports the process's peak RSS (VmHWM: this process image
#: only, unlike ru_maxrss, which counts the benchmark's memory copied by fork).
_WRAPPER = """
import sys
from wirekit.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as fh:
    hwm = [ln for ln in fh if ln.startswith("VmHWM:")]
sys.stderr.write(hwm[0] if hwm else "VmHWM: 0 kB\\n")
sys.exit(code)
"""
PEAK_RSS: list[int] = []


def command(python: str, path: str, *extra: str) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        proc = subprocess.run(
            [python, "-c", _WRAPPER, "decode", "--proto", "mip", *extra, path],
            stdout=sink,
            stderr=subprocess.PIPE,
            check=False,
            cwd=tempfile.gettempdir(),
        )
    elapsed = time.perf_counter() - t0
    line = proc.stderr.decode().strip().splitlines()[-1:]
    if line and line[0].startswith("VmHWM:"):
        PEAK_RSS.append(int(line[0].split()[1]) * 1024)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--python", help="another interpreter (an older wirekit) to compare")
    parser.add_argument("--keep", help="write the generated file here and keep it")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    args = parser.parse_args()
    path = args.keep or os.path.join(tempfile.mkdtemp(), "mip-200k.bin")
    size = generate(path, args.messages)
    n = args.messages

    def best(fn, *a):
        return min(fn(*a) for _ in range(max(1, args.repeat)))

    rows = {
        "codec": best(timed, codec_only, path),
        "struct+json": best(timed, struct_json, path),
        "decode human": best(command, sys.executable, path),
        "decode --json": best(command, sys.executable, path, "--json"),
    }
    rss = max(PEAK_RSS, default=0)  # the new decode only (the old ones come after)
    PEAK_RSS.clear()
    if args.python:
        rows["old decode human"] = best(command, args.python, path)
        rows["old decode --json"] = best(command, args.python, path, "--json")
    print(f"{n} messages, {size / 1e6:.1f} MB")
    for name, sec in rows.items():
        print(f"  {name:<18} {sec:7.2f} s  {n / sec / 1000:8.1f} k msg/s")
    print(f"  peak RSS of wirekit decode: {rss / 1e6:.0f} MB for a {size / 1e6:.0f} MB file")
    if args.python and PEAK_RSS:
        print(f"  peak RSS of the old decode: {max(PEAK_RSS) / 1e6:.0f} MB")
    print(f"  codec share of decode --json: {rows['codec'] / rows['decode --json']:.0%}")
    print(f"  codec share of decode human: {rows['codec'] / rows['decode human']:.0%}")
    print(f"  struct+json / decode --json: {rows['struct+json'] / rows['decode --json']:.2f}x")
    if args.python:
        for form in ("human", "--json"):
            old, new = rows[f"old decode {form}"], rows[f"decode {form}"]
            print(f"  speed-up {form}: {old / new:.2f}x")
    if not args.keep:
        os.unlink(path)


if __name__ == "__main__":
    main()
