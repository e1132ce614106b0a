"""Packet captures for ``wirekit decode``: read pcap/pcapng, reassemble each TCP connection.

No protocol knowledge here: :func:`read_packets` turns a pcap or pcapng file (detected by its
magic bytes; read with ``dpkt``) into TCP segments, and :class:`Reassembler` turns segments
into the ordered byte stream of each direction of each connection, as :class:`Chunk` and
:class:`Gap` events with the capture timestamps.

Reassembly is written here rather than taken from a library: ``dpkt`` parses packets but does
not reassemble, and the libraries that do (scapy's sessions, pyshark through tshark) are
large, keep whole sessions in memory, and do not say where bytes went missing, which is what
a debugging user needs to know.  The rules (sequence numbers modulo 2**32):

* a SYN fixes a direction's first sequence number; without one (a capture that starts
  mid-stream) the first segment seen does, and the direction is marked ``mid_stream``;
* a segment at the expected sequence number is delivered at once, then any queued segments
  it makes contiguous;
* bytes before the expected sequence number (a retransmission, an overlap) are dropped and
  counted in ``Stats.retransmitted``;
* a segment beyond the expected sequence number waits in a per-direction queue; when the
  queue holds more than ``max_pending`` bytes, or at the end of the capture, the missing
  range is given up: a :class:`Gap` event names its size and delivery goes on after it;
* at the end, bytes that the FIN (or else the peer's acknowledgements) shows were sent but
  that the capture never saw are a :class:`Gap` too (capturing hosts drop packets).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

#: Bytes a direction may hold out of order waiting for a missing segment (default 4 MiB).
DEFAULT_MAX_PENDING = 4 * 1024 * 1024

_SEQ = 1 << 32
_HALF = 1 << 31

PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1",
    b"\xa1\xb2\xc3\xd4",
    b"\x4d\x3c\xb2\xa1",
    b"\xa1\xb2\x3c\x4d",
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

# link types (https://www.tcpdump.org/linktypes.html)
LINKTYPE_NULL, LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LOOP = 0, 1, 101, 108
LINKTYPE_LINUX_SLL, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL2 = 113, 228, 229, 276
SUPPORTED_LINKTYPES = {
    LINKTYPE_NULL: "loopback (BSD)",
    LINKTYPE_LOOP: "loopback (OpenBSD)",
    LINKTYPE_ETHERNET: "Ethernet",
    LINKTYPE_RAW: "raw IP",
    12: "raw IP",
    LINKTYPE_IPV4: "raw IPv4",
    LINKTYPE_IPV6: "raw IPv6",
    LINKTYPE_LINUX_SLL: "Linux cooked",
    LINKTYPE_LINUX_SLL2: "Linux cooked v2",
}


class CaptureError(Exception):
    """A capture file that cannot be read (unknown format, unsupported link type)."""


def capture_format(head: bytes) -> str | None:
    """``"pcap"``, ``"pcapng"`` or None, from the first 4 bytes of a file."""
    if head[:4] in PCAP_MAGICS:
        return "pcap"
    if head[:4] == PCAPNG_MAGIC:
        return "pcapng"
    return None


Endpoint = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Segment:
    """One TCP segment: endpoints, sequence number, flags and payload, with its timestamp."""

    ts: float
    src: Endpoint
    dst: Endpoint
    seq: int
    syn: bool
    ack: bool
    fin: bool
    rst: bool
    payload: bytes
    ack_seq: int = 0  #: the acknowledgement number (meaningful when ``ack``)


def _ip_of(link: int, buf: bytes):
    import dpkt

    if link == LINKTYPE_ETHERNET:
        eth = dpkt.ethernet.Ethernet(buf)
        return eth.data
    if link in (LINKTYPE_NULL, LINKTYPE_LOOP):
        family = struct.unpack("<I" if link == LINKTYPE_NULL else ">I", buf[:4])[0]
        if family > 0xFFFF:  # DLT_NULL is in the capturing host's order
            family = struct.unpack(">I" if link == LINKTYPE_NULL else "<I", buf[:4])[0]
        body = buf[4:]
        return dpkt.ip.IP(body) if family == 2 else dpkt.ip6.IP6(body)
    if link in (LINKTYPE_RAW, 12, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return dpkt.ip.IP(buf) if buf[:1] and buf[0] >> 4 == 4 else dpkt.ip6.IP6(buf)
    if link == LINKTYPE_LINUX_SLL:
        return dpkt.sll.SLL(buf).data
    if link == LINKTYPE_LINUX_SLL2:
        return dpkt.sll2.SLL2(buf).data
    raise CaptureError(f"unsupported link type {link}")


def read_packets(fh: BinaryIO) -> Iterator[Segment]:
    """The TCP segments of a pcap or pcapng file, in capture order (other packets skipped).

    Streams: one packet at a time is held.  Raises :class:`CaptureError` for a file that is
    neither format or has an unsupported link type.
    """
    import socket

    import dpkt

    if hasattr(fh, "peek"):  # a pipe: look without consuming
        head = fh.peek(4)[:4]
    else:
        head = fh.read(4)
        fh.seek(0)
    fmt = capture_format(head)
    if fmt is None:
        raise CaptureError("not a pcap or pcapng file")
    try:
        reader = dpkt.pcap.Reader(fh) if fmt == "pcap" else dpkt.pcapng.Reader(fh)
    except (ValueError, dpkt.dpkt.Error) as exc:
        raise CaptureError(f"cannot read the {fmt} file: {exc}") from None
    link = reader.datalink()
    if link not in SUPPORTED_LINKTYPES:
        raise CaptureError(
            f"link type {link} is not supported (supported: "
            + ", ".join(sorted(set(SUPPORTED_LINKTYPES.values())))
            + ")"
        )
    try:
        for ts, buf in reader:
            try:
                ip = _ip_of(link, buf)
            except (dpkt.dpkt.Error, struct.error, IndexError, ValueError):
                continue  # not an IP packet we can parse: not ours
            tcp = getattr(ip, "data", None)
            if not isinstance(tcp, dpkt.tcp.TCP):
                continue
            family = socket.AF_INET if isinstance(ip, dpkt.ip.IP) else socket.AF_INET6
            src = (socket.inet_ntop(family, ip.src), tcp.sport)
            dst = (socket.inet_ntop(family, ip.dst), tcp.dport)
            flags = tcp.flags
            yield Segment(
                float(ts),
                src,
                dst,
                tcp.seq,
                bool(flags & dpkt.tcp.TH_SYN),
                bool(flags & dpkt.tcp.TH_ACK),
                bool(flags & dpkt.tcp.TH_FIN),
                bool(flags & dpkt.tcp.TH_RST),
                bytes(tcp.data),
                tcp.ack,
            )
    except (dpkt.dpkt.NeedData, struct.error, ValueError) as exc:
        raise CaptureError(f"the {fmt} file is cut short or damaged: {exc}") from None


# --- reassembly ---------------------------------------------------------------------------


@dataclass(slots=True)
class Chunk:
    """In-order bytes of one direction (``side`` 0: client to server, 1: server to client)."""

    conn: int
    side: int
    ts: float
    data: bytes


@dataclass(slots=True)
class Gap:
    """``size`` bytes of one direction are missing from the capture (never seen)."""

    conn: int
    side: int
    ts: float
    size: int


@dataclass(slots=True)
class Opened:
    """A new connection: ``client`` and ``server`` endpoints; ``mid_stream`` if no SYN seen."""

    conn: int
    ts: float
    client: Endpoint
    server: Endpoint
    mid_stream: bool


@dataclass(slots=True)
class Stats:
    """What reassembly met on the way."""

    segments: int = 0
    retransmitted: int = 0  #: segments (or parts) seen before, dropped
    reordered: int = 0  #: segments that arrived ahead of a missing one
    gaps: int = 0
    gap_bytes: int = 0


@dataclass(slots=True)
class _Direction:
    next_seq: int | None = None
    pending: dict[int, bytes] = field(default_factory=dict)
    pending_bytes: int = 0
    last_ts: float = 0.0
    fin_seq: int | None = None  #: where the FIN says the data ends
    acked: int | None = None  #: the highest acknowledgement the peer sent for it


@dataclass(slots=True)
class _Connection:
    number: int
    client: Endpoint
    server: Endpoint
    dirs: tuple[_Direction, _Direction]


class Reassembler:
    """Turn TCP segments into per-direction byte streams (see the module docstring).

    ``feed(segment)`` returns the events that segment completes; ``finish()`` those left at
    the end of the capture.  Connections are numbered from 1 in order of appearance.
    """

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.max_pending = max_pending
        self.stats = Stats()
        self._conns: dict[tuple[Endpoint, Endpoint], _Connection] = {}

    def _connection(self, seg: Segment, out: list) -> tuple[_Connection, int]:
        conn = self._conns.get((seg.src, seg.dst))
        if conn is not None:
            return conn, 0 if conn.client == seg.src else 1
        if seg.syn and seg.ack:  # a SYN-ACK comes from the server
            client, server = seg.dst, seg.src
        elif seg.syn:
            client, server = seg.src, seg.dst
        else:  # mid-stream: guess that the lower port is the server's (listening) port
            client, server = (seg.src, seg.dst) if seg.src[1] >= seg.dst[1] else (seg.dst, seg.src)
        conn = _Connection(len(self._conns) // 2 + 1, client, server, (_Direction(), _Direction()))
        self._conns[(client, server)] = self._conns[(server, client)] = conn
        out.append(Opened(conn.number, seg.ts, client, server, not seg.syn))
        return conn, 0 if client == seg.src else 1

    def feed(self, seg: Segment) -> list[Chunk | Gap | Opened]:
        out: list[Chunk | Gap | Opened] = []
        self.stats.segments += 1
        conn, side = self._connection(seg, out)
        d = conn.dirs[side]
        d.last_ts = seg.ts
        seq = seg.seq
        if seg.syn:
            if d.next_seq is None:
                d.next_seq = (seq + 1) % _SEQ
            seq = (seq + 1) % _SEQ
        if seg.fin:
            d.fin_seq = (seq + len(seg.payload)) % _SEQ
        if seg.ack:
            peer = conn.dirs[1 - side]
            if peer.acked is None or 0 < (seg.ack_seq - peer.acked) % _SEQ < _HALF:
                peer.acked = seg.ack_seq
        if not seg.payload:
            return out
        if d.next_seq is None:
            d.next_seq = seq
        self._take(conn, side, d, seq, seg.payload, seg.ts, out)
        return out

    def _take(self, conn, side, d: _Direction, seq, payload, ts, out) -> None:
        ahead = (seq - d.next_seq) % _SEQ
        if ahead >= _HALF:  # starts before what was delivered: drop the part seen before
            behind = _SEQ - ahead
            if behind >= len(payload):
                self.stats.retransmitted += 1
                return
            self.stats.retransmitted += 1
            payload = payload[behind:]
            ahead = 0
        if ahead:
            if seq not in d.pending or len(d.pending[seq]) < len(payload):
                d.pending_bytes += len(payload) - len(d.pending.get(seq, b""))
                d.pending[seq] = payload
                self.stats.reordered += 1
            if d.pending_bytes > self.max_pending:
                self._skip_gap(conn, side, d, ts, out)
            return
        out.append(Chunk(conn.number, side, ts, payload))
        d.next_seq = (d.next_seq + len(payload)) % _SEQ
        self._drain(conn, side, d, ts, out)

    def _drain(self, conn, side, d: _Direction, ts, out) -> None:
        while d.pending:
            for seq in list(d.pending):
                ahead = (seq - d.next_seq) % _SEQ
                if ahead == 0 or ahead >= _HALF:
                    payload = d.pending.pop(seq)
                    d.pending_bytes -= len(payload)
                    self._take(conn, side, d, seq, payload, ts, out)
                    break
            else:
                return

    def _skip_gap(self, conn, side, d: _Direction, ts, out) -> None:
        nearest = min(d.pending, key=lambda s: (s - d.next_seq) % _SEQ)
        size = (nearest - d.next_seq) % _SEQ
        self.stats.gaps += 1
        self.stats.gap_bytes += size
        out.append(Gap(conn.number, side, ts, size))
        d.next_seq = nearest
        self._drain(conn, side, d, ts, out)

    def finish(self) -> list[Chunk | Gap | Opened]:
        """End of the capture: give up on missing bytes, deliver what waits behind them."""
        out: list[Chunk | Gap | Opened] = []
        seen = set()
        for conn in self._conns.values():
            if conn.number in seen:
                continue
            seen.add(conn.number)
            for side, d in enumerate(conn.dirs):
                while d.pending:
                    self._skip_gap(conn, side, d, d.last_ts, out)
                # Bytes the FIN (or else the peer's acknowledgements) says were sent but the
                # capture never saw: a tail lost by the capturing host.
                end = d.fin_seq if d.fin_seq is not None else d.acked
                if end is not None and d.next_seq is not None:
                    missing = (end - d.next_seq) % _SEQ
                    if 0 < missing < _HALF and (d.fin_seq is not None or missing > 1):
                        self.stats.gaps += 1
                        self.stats.gap_bytes += missing
                        out.append(Gap(conn.number, side, d.last_ts, missing))
                        d.next_seq = end
        return out


# --- writing -------------------------------------------------------------------------------


class PcapngWriter:
    """Write TCP traffic as a pcapng file (Ethernet, IPv4 or IPv6) that ``read_packets`` reads.

    Used by ``wirekit record`` and by tests.  ``packet`` writes one segment as given;
    :class:`TcpConversation` keeps sequence numbers for a whole connection.
    """

    def __init__(self, fh: BinaryIO) -> None:
        import dpkt

        self._dpkt = dpkt
        self._writer = dpkt.pcapng.Writer(fh, linktype=LINKTYPE_ETHERNET)

    def packet(self, ts: float, src: Endpoint, dst: Endpoint, seq: int, ack: int,
               flags: int, payload: bytes = b"") -> None:  # fmt: skip
        import ipaddress

        dpkt = self._dpkt
        tcp = dpkt.tcp.TCP(sport=src[1], dport=dst[1], seq=seq % _SEQ, ack=ack % _SEQ,
                           flags=flags, win=65535, data=payload)  # fmt: skip
        a, b = ipaddress.ip_address(src[0]), ipaddress.ip_address(dst[0])
        if a.version == 4:
            ip = dpkt.ip.IP(src=a.packed, dst=b.packed, p=dpkt.ip.IP_PROTO_TCP, data=tcp)
            ethertype = dpkt.ethernet.ETH_TYPE_IP
        else:
            ip = dpkt.ip6.IP6(src=a.packed, dst=b.packed, nxt=dpkt.ip.IP_PROTO_TCP, hlim=64,
                              data=tcp)  # fmt: skip
            ip.plen = len(tcp)
            ethertype = dpkt.ethernet.ETH_TYPE_IP6
        eth = dpkt.ethernet.Ethernet(src=b"\0" * 6, dst=b"\0" * 6, type=ethertype, data=ip)
        self._writer.writepkt(bytes(eth), ts=ts)


class TcpConversation:
    """One TCP connection written to a :class:`PcapngWriter`: handshake, data, close."""

    MSS = 65000

    def __init__(self, writer: PcapngWriter, client: Endpoint, server: Endpoint,
                 isn: tuple[int, int] = (1000, 5000)) -> None:  # fmt: skip
        self.writer = writer
        self.ends = (client, server)
        self.seq = [isn[0], isn[1]]

    def open(self, ts: float) -> None:
        import dpkt

        c, s = self.ends
        w = self.writer
        w.packet(ts, c, s, self.seq[0], 0, dpkt.tcp.TH_SYN)
        w.packet(ts, s, c, self.seq[1], self.seq[0] + 1, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)
        self.seq = [self.seq[0] + 1, self.seq[1] + 1]
        w.packet(ts, c, s, self.seq[0], self.seq[1], dpkt.tcp.TH_ACK)

    def send(self, side: int, ts: float, data: bytes) -> None:
        """``side`` 0: the client sends, 1: the server sends."""
        import dpkt

        src, dst = self.ends if side == 0 else self.ends[::-1]
        for k in range(0, len(data), self.MSS):
            part = data[k : k + self.MSS]
            flags = dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH
            self.writer.packet(ts, src, dst, self.seq[side], self.seq[1 - side], flags, part)
            self.seq[side] += len(part)

    def close(self, ts: float) -> None:
        import dpkt

        for side in (0, 1):
            src, dst = self.ends if side == 0 else self.ends[::-1]
            flags = dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK
            self.writer.packet(ts, src, dst, self.seq[side], self.seq[1 - side], flags)
            self.seq[side] += 1
