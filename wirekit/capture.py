"""Packet captures for ``wirekit decode``: read pcap/pcapng, reassemble each TCP connection.

No protocol knowledge here: :class:`CaptureReader` takes a pcap or pcapng file's records
(detected by its magic bytes) out of its bytes as they arrive, :func:`segment_of` parses each
frame's link, IP and TCP layers with ``dpkt``, and :class:`Reassembler` turns segments into
the ordered byte stream of each direction of each connection, as :class:`Chunk` and
:class:`Gap` events with the capture timestamps.

The record layer is read here, not with ``dpkt.pcap.Reader``/``dpkt.pcapng.Reader``: those
pull from a file object and iterate whole records, so they cannot be fed a pipe's bytes as
they come (``tcpdump -U -w - | wirekit decode -`` printed nothing until tcpdump stopped), and
a file cut short ends their iteration with an exception or silently, without saying at which
byte and in which record -- what a user of a killed capture needs to be told.

Reassembly is written here rather than taken from a library: ``dpkt`` parses packets but does
not reassemble, and the libraries that do (scapy's sessions, pyshark through tshark) are
large, keep whole sessions in memory, and do not say where bytes went missing, which is what
a debugging user needs to know.  The rules (sequence numbers modulo 2**32):

* a SYN fixes a direction's first sequence number (a client's SYN after its FIN on the same
  addresses and ports opens a new connection: ports are reused); without one (a capture that starts
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
from socket import AF_INET as _AF_INET
from socket import AF_INET6 as _AF_INET6
from socket import inet_ntop as _inet_ntop
from typing import Any, BinaryIO

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


def _dpkt() -> Any:
    """dpkt, imported on first use (``wirekit`` starts without it)."""
    global _DPKT
    if _DPKT is None:
        import dpkt

        _DPKT = dpkt
    return _DPKT


_DPKT: Any = None


def _ip_of(link: int, buf: bytes):
    dpkt = _dpkt()

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


#: A record announcing more bytes than this is damage, not a packet (pcap and pcapng alike).
MAX_RECORD = 16 * 1024 * 1024

_PCAPNG_SHB, _PCAPNG_IDB, _PCAPNG_PB, _PCAPNG_SPB, _PCAPNG_EPB = 0x0A0D0D0A, 1, 2, 3, 6
_PCAPNG_BOM = 0x1A2B3C4D
_OPT_TSRESOL, _OPT_TSOFFSET = 9, 14


@dataclass(slots=True)
class _Interface:
    link: int
    snaplen: int
    units: float  #: timestamp units per second
    offset: int  #: seconds added to every timestamp (if_tsoffset)


class CaptureReader:
    """Pcap or pcapng records out of a capture file's bytes, fed as they arrive.

    ``feed(data)`` returns the ``(ts, link type, frame)`` of every record that ``data``
    completes; nothing waits for more than one record.  ``end()`` says how the file ends:
    None at a record boundary, else where and how it is cut short (a capture tool killed
    while writing) — everything before that point has been returned.  A file that is damaged
    (a record length no writer produces) stops there the same way: ``feed`` returns nothing
    more and ``end()`` says where.  :class:`CaptureError` is raised only for what cannot be
    read at all: not a capture, a link type that is not supported, a damaged file header.
    """

    def __init__(self) -> None:
        self.format: str | None = None
        self.packets = 0  #: records with a packet in them, so far
        self.offset = 0  #: file bytes consumed (the start of the next record)
        self._buf = b""  #: bytes not yet taken (records are slices of it: one copy each)
        self._pos = 0
        self._endian = "<"
        self._interfaces: list[_Interface] = []
        self._pcap_interface: _Interface | None = None
        self._damage: str | None = None
        self._last_ts = 0.0

    def feed(self, data: bytes) -> list[tuple[float, int, bytes]]:
        if self._damage is not None:
            return []
        self._buf = self._buf + data if self._buf else bytes(data)
        out: list[tuple[float, int, bytes]] = []
        if self.format is None and not self._start():
            return out
        if self.format == "pcap":
            self._pcap_records(out)
        else:
            self._pcapng_blocks(out)
        if self._pos:
            self._buf = self._buf[self._pos :]
            self.offset += self._pos
            self._pos = 0
        return out

    def end(self) -> str | None:
        """How the capture ends: None when it ends after a whole record (see the class).

        A file cut short or damaged before its first packet holds nothing to read: that is a
        :class:`CaptureError`.
        """
        ending = self._ending()
        if ending is not None and self.packets == 0:
            raise CaptureError(f"the {self.format or 'capture'} file is {ending}")
        return ending

    def _ending(self) -> str | None:
        if self._damage is not None:
            return self._damage
        have = len(self._buf) - self._pos
        if self.format is None:
            if have == 0:
                raise CaptureError("the file is empty")
            raise CaptureError(f"the file is cut short inside its {have}-byte header")
        if have == 0:
            return None
        at = self.offset + self._pos
        if self.format == "pcap":
            if have < 16:
                return (f"cut short at byte {at + have}: the record header of packet "
                        f"{self.packets + 1} is incomplete ({have} of 16 bytes)")  # fmt: skip
            caplen = struct.unpack_from(self._endian + "I", self._buf, self._pos + 8)[0]
            return (f"cut short at byte {at + have}: packet {self.packets + 1} is incomplete "
                    f"({have - 16} of its {caplen} bytes; its record starts at byte "
                    f"{at})")  # fmt: skip
        if have < 8:
            return (f"cut short at byte {at + have}: the header of the block after packet "
                    f"{self.packets} is incomplete ({have} of 8 bytes)")  # fmt: skip
        btype, blen = struct.unpack_from(self._endian + "II", self._buf, self._pos)
        what = ("packet " + str(self.packets + 1)
                if btype in (_PCAPNG_EPB, _PCAPNG_SPB, _PCAPNG_PB)
                else f"a block of type {btype:#x}")  # fmt: skip
        return (f"cut short at byte {at + have}: {what} is incomplete ({have} of its {blen} "
                f"bytes; its block starts at byte {at})")  # fmt: skip

    # -- pcap -----------------------------------------------------------------------------
    def _start(self) -> bool:
        buf = self._buf
        fmt = capture_format(bytes(buf[:4]))
        if fmt is None:
            if len(buf) >= 4:
                raise CaptureError("not a pcap or pcapng file")
            return False
        if fmt == "pcapng":
            self.format = fmt  # the section header block is read as any block
            return True
        if len(buf) < 24:
            return False
        magic = bytes(buf[:4])
        self._endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        units = 1e9 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1e6
        snaplen, link = struct.unpack_from(self._endian + "II", buf, 16)
        link &= 0xFFFF  # the upper bits carry FCS information
        _check_link(link)
        self._pcap_interface = _Interface(link, snaplen, units, 0)
        self.format = fmt
        self._pos = 24
        return True

    def _pcap_records(self, out: list) -> None:
        buf, pos, end = self._buf, self._pos, len(self._buf)
        iface = self._pcap_interface
        assert iface is not None
        head = struct.Struct(self._endian + "IIII")
        link, units = iface.link, iface.units
        while end - pos >= 16:
            sec, frac, caplen, _origlen = head.unpack_from(buf, pos)
            if caplen > MAX_RECORD:
                self._damaged(pos, f"packet {self.packets + 1} announces {caplen} bytes")
                break
            if end - pos - 16 < caplen:
                break
            self.packets += 1
            out.append((sec + frac / units, link, buf[pos + 16 : pos + 16 + caplen]))
            pos += 16 + caplen
        self._pos = pos

    # -- pcapng ---------------------------------------------------------------------------
    def _pcapng_blocks(self, out: list) -> None:
        buf, pos, end = self._buf, self._pos, len(self._buf)
        epb = struct.Struct(self._endian + "IIIII")
        while end - pos >= 12:
            if buf[pos : pos + 4] == PCAPNG_MAGIC:  # a section: its byte order
                bom = buf[pos + 8 : pos + 12]
                if bom == b"\x4d\x3c\x2b\x1a":
                    self._endian = "<"
                elif bom == b"\x1a\x2b\x3c\x4d":
                    self._endian = ">"
                else:
                    self._damaged(pos, "a section header block has no byte-order magic")
                    break
            btype, blen = struct.unpack_from(self._endian + "II", buf, pos)
            if blen < 12 or blen % 4 or blen > MAX_RECORD:
                self._damaged(pos, f"a block announces a length of {blen} bytes")
                break
            if end - pos < blen:
                break
            if btype == _PCAPNG_EPB and blen >= 32:  # the packets: the common case, inline
                iface_id, high, low, caplen, _len = epb.unpack_from(buf, pos + 8)
                if caplen > blen - 32 or iface_id >= len(self._interfaces):
                    self._damaged(pos, f"packet {self.packets + 1} does not fit its block")
                    break
                iface = self._interfaces[iface_id]
                ts = ((high << 32) | low) / iface.units + iface.offset
                self._last_ts = ts
                self.packets += 1
                out.append((ts, iface.link, buf[pos + 28 : pos + 28 + caplen]))
                pos += blen
                continue
            if btype == _PCAPNG_SHB:
                epb = struct.Struct(self._endian + "IIIII")
            try:
                self._block(btype, buf[pos + 8 : pos + blen - 4], out)
            except (struct.error, IndexError):
                self._damaged(pos, f"a block of type {btype:#x} does not fit its length")
            if self._damage is not None:
                break
            pos += blen
        self._pos = pos

    def _block(self, btype: int, body: bytes, out: list) -> None:
        e = self._endian
        if btype == _PCAPNG_SHB:
            self._interfaces = []
        elif btype == _PCAPNG_IDB:
            link, _reserved, snaplen = struct.unpack_from(e + "HHI", body)
            units, offset = 1e6, 0
            for code, value in _options(e, body[8:]):
                if code == _OPT_TSRESOL and value:
                    r = value[0]
                    units = float(2 ** (r & 0x7F)) if r & 0x80 else float(10**r)
                elif code == _OPT_TSOFFSET and len(value) == 8:
                    offset = struct.unpack(e + "q", value)[0]
            _check_link(link)
            self._interfaces.append(_Interface(link, snaplen, units, offset))
        elif btype in (_PCAPNG_EPB, _PCAPNG_PB):
            if btype == _PCAPNG_EPB:
                iface_id, high, low, caplen, _len = struct.unpack_from(e + "IIIII", body)
            else:
                iface_id, _drops, high, low, caplen, _len = struct.unpack_from(e + "HHIIII", body)
            if caplen > len(body) - 20:
                raise IndexError("caplen")
            iface = self._interfaces[iface_id]
            ts = ((high << 32) | low) / iface.units + iface.offset
            self._last_ts = ts
            self.packets += 1
            out.append((ts, iface.link, body[20 : 20 + caplen]))
        elif btype == _PCAPNG_SPB:
            (origlen,) = struct.unpack_from(e + "I", body)
            iface = self._interfaces[0]
            caplen = min(origlen, len(body) - 4, iface.snaplen or origlen)
            self.packets += 1  # no timestamp: the previous packet's
            out.append((self._last_ts, iface.link, body[4 : 4 + caplen]))

    def _damaged(self, pos: int, what: str) -> None:
        self._damage = (f"damaged at byte {self.offset + pos}: {what}; the rest of the file is "
                        "not read")  # fmt: skip


def _options(e: str, data: bytes) -> Iterator[tuple[int, bytes]]:
    """The (code, value) options of a pcapng block, up to opt_endofopt."""
    pos = 0
    while len(data) - pos >= 4:
        code, size = struct.unpack_from(e + "HH", data, pos)
        if code == 0:
            return
        yield code, data[pos + 4 : pos + 4 + size]
        pos += 4 + (size + 3) // 4 * 4


def _check_link(link: int) -> None:
    if link not in SUPPORTED_LINKTYPES:
        raise CaptureError(
            f"link type {link} is not supported (supported: "
            + ", ".join(sorted(set(SUPPORTED_LINKTYPES.values())))
            + ")"
        )


def segment_of(ts: float, link: int, frame: bytes) -> Segment | None:
    """The TCP segment in one captured frame, or None (not TCP, or not parseable)."""
    dpkt = _dpkt()
    try:
        ip = _ip_of(link, frame)
    except (dpkt.dpkt.Error, struct.error, IndexError, ValueError):
        return None  # not an IP packet we can parse: not ours
    tcp = getattr(ip, "data", None)
    if not isinstance(tcp, dpkt.tcp.TCP):
        return None
    family = _AF_INET if isinstance(ip, dpkt.ip.IP) else _AF_INET6
    flags = tcp.flags
    return Segment(
        float(ts),
        (_inet_ntop(family, ip.src), tcp.sport),
        (_inet_ntop(family, ip.dst), tcp.dport),
        tcp.seq,
        bool(flags & dpkt.tcp.TH_SYN),
        bool(flags & dpkt.tcp.TH_ACK),
        bool(flags & dpkt.tcp.TH_FIN),
        bool(flags & dpkt.tcp.TH_RST),
        bytes(tcp.data),
        tcp.ack,
    )


def read_packets(fh: BinaryIO, chunk: int = 1 << 20) -> Iterator[Segment]:
    """The TCP segments of a pcap or pcapng file, in capture order (other packets skipped).

    Streams (one chunk of the file at a time).  Raises :class:`CaptureError` for a file that
    is neither format or has an unsupported link type, and — after the last whole packet —
    for a file that is cut short or damaged.
    """
    reader = CaptureReader()
    while data := fh.read(chunk):
        for record in reader.feed(data):
            seg = segment_of(*record)
            if seg is not None:
                yield seg
    ending = reader.end()
    if ending is not None:
        raise CaptureError(f"the {reader.format} file is {ending}")


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
        self._opened: list[_Connection] = []  # every connection, in order (ports get reused)

    def _connection(self, seg: Segment, out: list) -> tuple[_Connection, int]:
        conn = self._conns.get((seg.src, seg.dst))
        reused = (  # a client's new SYN after its FIN: the same ports, a new connection
            conn is not None
            and seg.syn
            and not seg.ack
            and conn.client == seg.src
            and conn.dirs[0].fin_seq is not None
        )
        if conn is not None and not reused:
            return conn, 0 if conn.client == seg.src else 1
        if seg.syn and seg.ack:  # a SYN-ACK comes from the server
            client, server = seg.dst, seg.src
        elif seg.syn:
            client, server = seg.src, seg.dst
        else:  # mid-stream: guess that the lower port is the server's (listening) port
            client, server = (seg.src, seg.dst) if seg.src[1] >= seg.dst[1] else (seg.dst, seg.src)
        conn = _Connection(len(self._opened) + 1, client, server, (_Direction(), _Direction()))
        self._opened.append(conn)
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
        assert d.next_seq is not None  # set before any payload is taken
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
        assert d.next_seq is not None  # set before any payload is taken
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
        next_seq = d.next_seq
        assert next_seq is not None  # set before any payload is taken
        nearest = min(d.pending, key=lambda s: (s - next_seq) % _SEQ)
        size = (nearest - next_seq) % _SEQ
        self.stats.gaps += 1
        self.stats.gap_bytes += size
        out.append(Gap(conn.number, side, ts, size))
        d.next_seq = nearest
        self._drain(conn, side, d, ts, out)

    def finish(self) -> list[Chunk | Gap | Opened]:
        """End of the capture: give up on missing bytes, deliver what waits behind them."""
        out: list[Chunk | Gap | Opened] = []
        for conn in self._opened:
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
