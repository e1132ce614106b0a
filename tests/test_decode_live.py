"""``wirekit decode`` on captures as they come in real life, through real processes.

A tcpdump capture cut short (inside a record header, inside a packet; pcap and pcapng), a
live ``tcpdump -U -w - | wirekit decode -`` and a pipe written slowly, and the progress line
on a terminal (a pty) for a long input.
"""

from __future__ import annotations

import io
import os
import pty
import signal
import struct
import subprocess
import sys
import threading
import time

import dpkt
import pytest
from capture_tools import WAIT, Lines, need, tcpdump

from wirekit import capture, mip
from wirekit.mip.client import Client
from wirekit.mip.server import ServerThread

DECODE = [sys.executable, "-m", "wirekit.cli", "decode"]
REQUESTS = 5


def echo(batch):
    return [list(sample) for sample in batch]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# --- a capture cut short -------------------------------------------------------------------


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """A real tcpdump capture of a MIP session (pcap), and the same made pcapng by editcap."""
    path = tmp_path_factory.mktemp("cut") / "session.pcap"
    with (
        ServerThread(echo, "tcp://127.0.0.1:0") as running,
        tcpdump(_port(running.address), path),
        Client(running.address) as client,
    ):
        for k in range(REQUESTS):
            client.infer([[mip.Item.text(f"request {k}")]])
        # tcpdump writes each packet once it sees it (-U): wait for the last answer
        deadline = time.monotonic() + WAIT
        while _decode(path, "--json").stdout.count('"dir":"S>C"') < REQUESTS:
            assert time.monotonic() < deadline, "tcpdump did not write the session"
            time.sleep(0.05)
    ng = path.with_suffix(".pcapng")
    subprocess.run([need("editcap"), "-F", "pcapng", str(path), str(ng)], check=True,
                   timeout=WAIT, capture_output=True)  # fmt: skip
    return {"pcap": path, "pcapng": ng}


def _records(data: bytes, fmt: str) -> list[tuple[int, bytes]]:
    """(file offset, frame) of each packet record, read by hand (not by the code tested)."""
    out = []
    if fmt == "pcap":
        pos = 24
        while pos < len(data):
            caplen = struct.unpack_from("<I", data, pos + 8)[0]
            out.append((pos, data[pos + 16 : pos + 16 + caplen]))
            pos += 16 + caplen
        return out
    pos = 0
    while pos < len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        if btype == 6:  # an enhanced packet block
            caplen = struct.unpack_from("<I", data, pos + 20)[0]
            out.append((pos, data[pos + 28 : pos + 28 + caplen]))
        pos += blen
    return out


def _payload(frame: bytes) -> bytes:
    return bytes(dpkt.ethernet.Ethernet(frame).data.data.data)


def _decode(path, *extra):
    return subprocess.run([*DECODE, *extra, str(path)], capture_output=True, text=True,
                          timeout=WAIT, check=False)  # fmt: skip


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("where", ["record header", "packet"])
def test_a_capture_cut_short_prints_everything_before_the_cut(captures, fmt, where, tmp_path):
    """tcpdump killed mid-write: every message before the cut, then where the file ends.

    The old reader printed nothing (a cut in a record header: exit 2) or dropped the tail
    without a word (a cut in a packet: exit 0).
    """
    data = captures[fmt].read_bytes()
    whole = _decode(captures[fmt], "--json")
    assert whole.returncode == 0, whole.stderr
    with_data = [(pos, frame) for pos, frame in _records(data, fmt) if _payload(frame)]
    last_reply_at, last_reply = with_data[-1]  # the server's answer to the last request
    assert b"request 4" in _payload(last_reply)
    head = 16 if fmt == "pcap" else 8
    cut = last_reply_at + (7 if where == "record header" else head + 80)
    cut_path = tmp_path / f"cut.{fmt}"
    cut_path.write_bytes(data[:cut])

    proc = _decode(cut_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum("inference request" in ln for ln in lines) == REQUESTS
    assert sum("inference response" in ln for ln in lines) == REQUESTS - 1
    assert f"'request {REQUESTS - 1}'" in proc.stdout  # the last request, before the cut
    end = [ln for ln in lines if ln.startswith("== the capture is cut short")]
    assert end == [lines[-2]], proc.stdout  # last, before the summary
    assert f"at byte {cut}:" in end[0]
    assert ("incomplete (7 of" if where == "record header" else "is incomplete (") in end[0]
    assert "the capture is cut short" in proc.stderr and "exit status 1" in proc.stderr

    jproc = _decode(cut_path, "--json")
    import json

    recs = [json.loads(ln) for ln in jproc.stdout.splitlines()]
    assert recs[-1]["kind"] == "capture_end" and f"at byte {cut}:" in recs[-1]["note"]
    assert [r["number"] for r in recs[:-1]] == [r["number"] for r in
        map(json.loads, whole.stdout.splitlines())][: len(recs) - 1]  # fmt: skip


def test_a_damaged_record_length_stops_there_with_what_came_before(captures, tmp_path):
    data = bytearray(captures["pcap"].read_bytes())
    records = _records(bytes(data), "pcap")
    last = max(k for k, (_pos, frame) in enumerate(records) if _payload(frame))
    pos = records[last][0]  # the last answer's packet
    struct.pack_into("<I", data, pos + 8, 0x7FFFFFFF)  # a caplen no writer produces
    path = tmp_path / "damaged.pcap"
    path.write_bytes(bytes(data))
    proc = _decode(path)
    assert proc.returncode == 1
    assert f"== the capture is damaged at byte {pos}: packet" in proc.stdout
    assert proc.stdout.count("inference request") == REQUESTS
    assert proc.stdout.count("inference response") == REQUESTS - 1


def test_a_capture_cut_inside_its_file_header_cannot_be_read(captures, tmp_path):
    path = tmp_path / "head.pcap"
    path.write_bytes(captures["pcap"].read_bytes()[:20])
    proc = _decode(path)
    assert proc.returncode == 2 and "cut short inside its 20-byte header" in proc.stderr


# --- live: bytes decoded as they come --------------------------------------------------------


def test_tcpdump_piped_into_decode_prints_each_exchange_as_it_happens():
    """``tcpdump -U -w - | wirekit decode -``: lines come out while tcpdump still runs."""
    tool = need("tcpdump")
    with ServerThread(echo, "tcp://127.0.0.1:0") as running:
        port = _port(running.address)
        dump = subprocess.Popen(
            [tool, "-i", "lo", "-U", "--immediate-mode", "-s", "0", "-w", "-",
             f"tcp port {port}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        decoder = subprocess.Popen([*DECODE, "-"], stdin=dump.stdout, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        dump.stdout.close()  # the decoder holds the pipe now
        out = Lines(decoder.stdout)
        try:
            # tcpdump starts capturing a little after it starts: ping until a ping shows
            deadline = time.monotonic() + WAIT
            while out.wait_for("ping response", timeout=0.5) is None:
                assert time.monotonic() < deadline, f"no line while tcpdump runs: {out.seen}"
                with Client(running.address) as client:
                    client.ping()
            for k in range(3):
                with Client(running.address) as client:
                    client.infer([[mip.Item.text(f"live {k}")]])
                assert out.wait_for(f"'live {k}'  [reply to") is not None, out.seen
            assert dump.poll() is None and decoder.poll() is None  # both still running
        finally:
            dump.send_signal(signal.SIGINT)
            dump.wait(WAIT)
            decoder.wait(WAIT)
            decoder.stderr.close()
    rest = out.rest()
    assert decoder.returncode == 0, rest
    assert "message(s)" in rest[-1]


def _capture_steps() -> list[bytes]:
    """A pcapng capture cut where a writer flushes: the file header and connection opening,
    then the packets of each exchange, then the close."""
    buf = io.BytesIO()
    conv = capture.TcpConversation(capture.PcapngWriter(buf), ("127.0.0.1", 40000),
                                   ("127.0.0.1", 7000))  # fmt: skip
    conv.open(1.0)
    steps, done = [], 0

    def step() -> None:
        nonlocal done
        steps.append(buf.getvalue()[done:])
        done = len(buf.getvalue())

    step()
    for k in range(3):
        conv.send(0, 2.0 + k, mip.encode(mip.Inference.request([[mip.Item.text(f"slow {k}")]])))
        conv.send(1, 2.5 + k, mip.encode(mip.Inference.reply([[mip.Item.text("ok")]], 1)))
        step()
    conv.close(9.0)
    step()
    return steps


@pytest.mark.parametrize("form", ["capture", "raw"])
def test_a_pipe_written_slowly_is_decoded_as_it_comes(form):
    """Each message is printed once its bytes are in, before the writer closes the pipe."""
    decoder = subprocess.Popen(
        [*DECODE, *(["--proto", "mip"] if form == "raw" else []), "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False,
    )  # fmt: skip
    out = Lines(io.TextIOWrapper(decoder.stdout, encoding="utf-8"))
    try:
        if form == "capture":
            opening, *steps, closing = _capture_steps()
            decoder.stdin.write(opening)
        else:
            steps = [mip.encode(mip.Inference.request([[mip.Item.text(f"slow {k}")]]))
                     for k in range(3)]  # fmt: skip
        for k, step in enumerate(steps):
            half = len(step) // 2
            decoder.stdin.write(step[:half])  # half a message: nothing to print yet
            decoder.stdin.flush()
            decoder.stdin.write(step[half:])
            decoder.stdin.flush()
            assert out.wait_for(f"'slow {k}'") is not None, out.seen
            assert decoder.poll() is None
        if form == "capture":
            decoder.stdin.write(closing)
    finally:
        decoder.stdin.close()
        decoder.wait(WAIT)
        decoder.stderr.close()
    assert decoder.returncode == 0
    assert f"{3 if form == 'raw' else 6} message(s)" in out.rest()[-1]


# --- progress on a terminal -------------------------------------------------------------------


class Terminal:
    """A pty for a process's standard error; everything written to it, read by a thread."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def started(self) -> None:
        os.close(self.slave)  # the child has it
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            self.data += chunk

    def text(self) -> str:
        self._thread.join(WAIT)
        os.close(self.master)
        return self.data.decode("utf-8", "replace")


def _mip_file(path, megabytes: int):
    one = mip.encode(mip.Ping()) + mip.encode(mip.Inference.request([[mip.Item.text("x" * 40)]]))
    path.write_bytes(one * (megabytes * (1 << 20) // len(one)))
    return path


def test_progress_on_a_terminal_for_a_long_file(tmp_path):
    """A long decode shows how far it has got on a terminal's stderr, then erases it.

    The test holds the decoder's output unread for a while (its stdout pipe fills and it
    waits), so the decode lasts long enough for the progress line, whatever the machine.
    """
    path = _mip_file(tmp_path / "big.bin", 4)
    term = Terminal()
    proc = subprocess.Popen([*DECODE, "--proto", "mip", str(path)], stdout=subprocess.PIPE,
                            stderr=term.slave)  # fmt: skip
    term.started()
    first = proc.stdout.readline()  # the decoder has started; its first chunk's output
    time.sleep(1.0)  # is far more than a pipe holds: it waits while this reads nothing
    out, _ = proc.communicate(timeout=120)
    out = first + out
    shown = term.text()
    assert proc.returncode == 0
    assert out.decode().splitlines()[-1].endswith(f"{path.stat().st_size} bytes")
    assert "wirekit decode: " in shown and "% (" in shown and f"of {4 * 1.048576:.1f} MB)" in shown
    assert shown.endswith("\r\x1b[K")  # erased at the end
    assert "messages" in shown and "s left" in shown


def test_progress_of_a_pipe_counts_bytes_and_is_off_with_quiet(tmp_path):
    data = _mip_file(tmp_path / "big.bin", 2).read_bytes()
    for quiet in (False, True):
        term = Terminal()
        proc = subprocess.Popen(
            [*DECODE, *(["-q"] if quiet else []), "--proto", "mip", "-"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=term.slave,
        )  # fmt: skip
        term.started()
        proc.stdin.write(data[: len(data) // 2])
        proc.stdin.flush()
        time.sleep(1.0)  # the decoder waits for more input: time passes
        proc.stdin.write(data[len(data) // 2 :])
        proc.stdin.close()
        assert proc.wait(120) == 0
        shown = term.text()
        if quiet:
            assert shown == ""
        else:
            assert "MB read, " in shown and "%" not in shown and shown.endswith("\r\x1b[K")


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    data = _mip_file(tmp_path / "big.bin", 2).read_bytes()
    proc = subprocess.Popen([*DECODE, "--proto", "mip", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdin.write(data[: len(data) // 2])
    proc.stdin.flush()
    time.sleep(1.0)
    proc.stdin.write(data[len(data) // 2 :])
    proc.stdin.close()
    assert proc.wait(120) == 0
    assert proc.stderr.read() == b""
    proc.stderr.close()
