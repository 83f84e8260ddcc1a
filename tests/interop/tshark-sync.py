#!/usr/bin/env python3
"""Where tshark lost the FPDU boundaries of one TCP port's connections, if it did.

Usage: tshark-sync.py PCAP PORT DISSECT_JSONL [TSHARK_OPTION...]

The options (lib.sh's IW_TSHARK_OPTS) go to tshark, so that it decodes as the checks that call
this did.

tshark's MPA dissector (Wireshark 4.0) finds FPDUs without markers segment by segment, and on a
stream whose TCP segments stop starting at FPDU boundaries (kernel TCP sends what the receive
window allows, so a full window cuts an FPDU short) it can take payload bytes for an FPDU header,
decode a bogus ULPDU length and reassemble garbage, which it then flags as malformed. `iwarp
dissect` reassembles each direction's byte stream and walks it FPDU by FPDU, so it knows where
each FPDU really starts.

This prints the first frame in which tshark decoded an FPDU header whose ULPDU length matches no
FPDU that `iwarp dissect` (its JSON Lines output, DISSECT_JSONL) saw starting in that frame, and
the two views; it prints nothing when tshark's FPDUs all agree. Frames tshark flags as malformed
from that frame on come from its lost sync, not from the stream.
"""

import json
import subprocess
import sys


def main() -> int:
    pcap, port, dissect, opts = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    conns = set()
    ours: dict[int, set[int]] = {}
    with open(dissect, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("record") == "connection":
                ends = (rec.get("initiator", ""), rec.get("responder", ""))
                if any(e.rsplit(":", 1)[-1] == str(port) for e in ends):
                    conns.add(rec["id"])
            elif rec.get("record") == "fpdu" and rec.get("conn") in conns:
                ours.setdefault(rec["frame"], set()).add(rec["ulpdu_len"])
    out = subprocess.run(
        ["tshark", "-r", pcap, *opts, "-Y", f"tcp.port == {port} && iwarp_mpa",
         "-T", "fields", "-e", "frame.number", "-e", "iwarp_mpa.ulpdulength"],
        capture_output=True, text=True, check=False,
    ).stdout
    for row in out.splitlines():
        frame, _, lengths = row.partition("\t")
        if not lengths:
            continue
        theirs = {int(x) for x in lengths.split(",") if x}
        if not theirs <= ours.get(int(frame), set()):
            print(f"{frame} (tshark: ULPDU {sorted(theirs)}, iwarp dissect: {sorted(ours.get(int(frame), set()))})")
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
