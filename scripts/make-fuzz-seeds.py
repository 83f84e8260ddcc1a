#!/usr/bin/env python3
"""Builds the fuzz seed corpora from the siw captures in tests/data/siw.

For every TCP connection that starts with an MPA Request, it writes the Request and the
Reply (with a policy-selector byte in front) as seeds for `mpa_frame`, the first ULPDUs for
`ddp_rdmap_parse`, and the first few KiB
of each direction's FPDU stream (with a selector byte for CRC on/off) for `mpa_deframe`.
Only classic pcap with Ethernet/IPv4/TCP is needed for these captures.
"""
import glob
import hashlib
import os
import struct
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "fuzz", "corpus")


def packets(path):
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def tcp_streams(path):
    flows = {}
    for pkt in packets(path):
        if len(pkt) < 14 or pkt[12:14] != b"\x08\x00":
            continue
        ip = pkt[14:]
        ihl = (ip[0] & 15) * 4
        if ip[9] != 6:
            continue
        total = struct.unpack(">H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        payload = tcp[doff:]
        key = (ip[12:16], sport, ip[16:20], dport)
        segs = flows.setdefault(key, {})
        if payload:
            segs.setdefault(seq, payload)
    for key, segs in flows.items():
        stream = b""
        if not segs:
            continue
        nxt = min(segs)
        for seq in sorted(segs):
            p = segs[seq]
            if seq < nxt:
                p = p[nxt - seq:]
            elif seq > nxt:
                break
            stream += p
            nxt = seq + len(segs[seq])
        yield key, stream


def write(target, content):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(content).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(content)


count = 0
for path in sorted(glob.glob(os.path.join(root, "tests", "data", "siw", "*.pcap"))):
    crc_capture = "crc" in os.path.basename(path)
    for key, stream in tcp_streams(path):
        if not stream.startswith((b"MPA ID Req Frame", b"MPA ID Rep Frame")) or len(stream) < 20:
            continue
        flen = 20 + struct.unpack(">H", stream[18:20])[0]
        frame = stream[:flen]
        for sel in (0x00, 0x21, 0x83):
            write("mpa_frame", bytes([sel]) + frame)
        crc = 1 if (stream[16] & 0x40 or crc_capture) else 0
        body = stream[flen:flen + 4096]
        if body:
            write("mpa_deframe", bytes([crc]) + body)
        # The first FPDUs' ULPDUs (no markers in these captures) seed the DDP/RDMAP parser.
        off = flen
        for _ in range(6):
            if off + 2 > len(stream):
                break
            ulen = struct.unpack(">H", stream[off:off + 2])[0]
            ulpdu = stream[off + 2:off + 2 + ulen]
            if len(ulpdu) == ulen:
                write("ddp_rdmap_parse", ulpdu[:512])
            off += 2 + ulen + (4 - (ulen + 2) % 4) % 4 + 4
        count += 1
print(f"seeds from {count} MPA streams written under {out}")


# `dissect`: each capture cut to its first packets (at most 8 KiB, so the fuzzer's inputs stay
# small), and one converted to pcapng, so that both file formats are reached.
def pcap_prefix(data, limit):
    off = 24
    endian = "<" if struct.unpack("<I", data[:4])[0] in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    while off + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[off + 8:off + 12])[0]
        if off + 16 + incl > limit:
            break
        off += 16 + incl
    return data[:off]


def pcapng_of(data):
    def block(kind, body):
        body += b"\0" * (-len(body) % 4)
        total = len(body) + 12
        return struct.pack("<II", kind, total) + body + struct.pack("<I", total)

    link = struct.unpack("<I", data[20:24])[0]
    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", link, 0, 65535))
    off = 24
    while off + 16 <= len(data):
        sec, usec, incl, orig = struct.unpack("<IIII", data[off:off + 16])
        ts = sec * 1000000 + usec
        body = struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, incl, orig) + data[off + 16:off + 16 + incl]
        out += block(6, body)
        off += 16 + incl
    return out


dissect_seeds = 0
for path in sorted(glob.glob(os.path.join(root, "tests", "data", "siw", "*.pcap"))):
    data = open(path, "rb").read()
    seed = pcap_prefix(data, 8192)
    write("dissect", seed)
    dissect_seeds += 1
    if os.path.basename(path) == "siw-rping.pcap":
        write("dissect", pcapng_of(pcap_prefix(data, 4096)))
        dissect_seeds += 1
print(f"{dissect_seeds} dissect seeds written under {out}")
