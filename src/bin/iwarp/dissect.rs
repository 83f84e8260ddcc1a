//! `iwarp dissect FILE`: decode the MPA traffic of a capture.

use crate::io_message;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use iwarp::dissect::ddp::{Body, DdpHeader, Model, ReadRequestInfo, Segment, TerminateReading};
use iwarp::dissect::{self, Connection, DissectError, FpduInfo, FrameInfo, Options, Report};

/// Exit status when the capture decoded with protocol violations.
const EXIT_VIOLATIONS: u8 = 1;
/// Exit status when the file could not be dissected at all.
const EXIT_ERROR: u8 = 2;

/// Decode the iWARP connections in a pcap/pcapng capture: MPA handshakes, every FPDU and its
/// DDP segment and RDMAP message.
///
/// Reads a pcap or pcapng file (Ethernet, raw IP, Linux cooked or loopback link types),
/// reassembles every TCP connection in both directions, finds the MPA connections by their
/// Request/Reply, and prints the handshake and every FPDU (length, pad, CRC verdict, marker
/// positions, DDP header, RDMAP opcode and body), one line each.
///
/// Exit status: 0 when everything decoded cleanly, 1 when there were protocol violations (bad
/// CRC or marker, malformed frame or segment, MSN/MO sequence errors, a Read Response that
/// does not match its request, a responder sending first; a one-line summary goes to stderr),
/// 2 when the file could not be read or is not a capture.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The capture file (pcap or pcapng).
    file: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Add a hex dump of each FPDU's ULPDU (16 bytes a line; in JSON a hex string).
    #[arg(short, long)]
    verbose: bool,
}

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    let options = Options { keep_ulpdu: args.verbose };
    let shown = args.file.display();
    let report = match dissect::dissect_file(&args.file, &options) {
        Ok(r) => r,
        Err(DissectError::Io(e)) => {
            eprintln!("error: cannot open {shown}: {}", io_message(&e));
            return ExitCode::from(EXIT_ERROR);
        }
        Err(DissectError::NotACapture) => {
            eprintln!("error: {shown} is not a pcap or pcapng capture");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let text = if args.json { json(args, &report) } else { Ok(text(args, &report)) };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot encode the report as JSON: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth reporting.
    let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
    match report.violation_summary() {
        Some(summary) => {
            eprintln!("dissect: {summary}");
            ExitCode::from(EXIT_VIOLATIONS)
        }
        None => ExitCode::SUCCESS,
    }
}

fn json(args: &Args, report: &Report) -> Result<String, serde_json::Error> {
    #[derive(serde::Serialize)]
    struct Doc<'a> {
        file: String,
        mpa_connections: usize,
        fpdu_count: usize,
        violation_count: usize,
        #[serde(flatten)]
        report: &'a Report,
    }
    let doc = Doc {
        file: args.file.display().to_string(),
        mpa_connections: report.mpa_connections(),
        fpdu_count: report.fpdus(),
        violation_count: report.violations.len(),
        report,
    };
    let mut s = serde_json::to_string_pretty(&doc)?;
    s.push('\n');
    Ok(s)
}

fn flags(f: &FrameInfo) -> String {
    let mut names = Vec::new();
    for (set, name) in [(f.markers, "M"), (f.crc, "C"), (f.reject, "R"), (f.enhanced, "H")] {
        if set {
            names.push(name.to_string());
        }
    }
    if f.flags & 0x0f != 0 {
        names.push(format!("res 0x{:x}", f.flags & 0x0f));
    }
    format!("0x{:02x} [{}]", f.flags, names.join(" "))
}

fn frame_line(name: &str, f: &FrameInfo) -> String {
    let mut s = format!("  {name} rev {} flags {}", f.revision, flags(f));
    if let Some(w) = f.ird_ord {
        s.push_str(&format!(" IRD {} ORD {}", w.ird, w.ord));
        if w.p2p {
            let rtr: Vec<&str> = [(w.rtr_send, "send"), (w.rtr_write, "write"), (w.rtr_read, "read")]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, n)| *n)
                .collect();
            s.push_str(&format!(
                " P2P RTR {}",
                if rtr.is_empty() { "none".to_string() } else { rtr.join("+") }
            ));
        }
    }
    s.push_str(&format!(" pd {} bytes", f.pd_len));
    if !f.private_data.is_empty() {
        s.push_str(&format!(" {}", dissect::hex(&f.private_data)));
    }
    if let Some(fr) = f.frame {
        s.push_str(&format!(" (frame {fr})"));
    }
    s
}

fn fpdu_line(f: &FpduInfo) -> String {
    let mut s = format!("  {} FPDU #{} @{}", f.dir, f.index, f.offset);
    if let Some(fr) = f.frame {
        s.push_str(&format!(" frame {fr}"));
    }
    s.push_str(&format!(" len {} pad {} CRC {}", f.ulpdu_len, f.pad, f.crc));
    if !f.markers.is_empty() {
        let m: Vec<String> = f.markers.iter().map(|p| format!("@{p}")).collect();
        s.push_str(&format!(" markers {}", m.join(",")));
    }
    match (&f.segment, f.ddp) {
        (Some(seg), _) => {
            s.push_str(" | ");
            s.push_str(&segment_text(seg));
        }
        (None, Some(d)) => s.push_str(&format!(
            " | undecoded ddp 0x{:02x} rdmap 0x{:02x} ({} {}{})",
            d.ddp,
            d.rdmap,
            if d.tagged { "tagged" } else { "untagged" },
            if d.last { "L " } else { "" },
            d.opcode_name
        )),
        (None, None) => {}
    }
    s
}

fn header_text(h: &DdpHeader) -> String {
    let l = if h.last { "L " } else { "" };
    match h.model {
        Model::Tagged { stag, to } => format!("tagged {l}{} STag 0x{stag:08x} TO 0x{to:x}", h.opcode),
        Model::Untagged { rdmap_word, qn, msn, mo } => {
            let mut s = format!("untagged {l}{} QN {qn} MSN {msn} MO {mo}", h.opcode);
            if rdmap_word != 0 || matches!(h.opcode, "SendInv" | "SendSEInv") {
                s.push_str(&format!(" InvSTag 0x{rdmap_word:08x}"));
            }
            s
        }
    }
}

fn reading_text(r: &TerminateReading) -> String {
    let mut flags: Vec<&str> = Vec::new();
    for (on, n) in [(r.m, "M"), (r.d, "D"), (r.r, "R")] {
        if on {
            flags.push(n);
        }
    }
    format!("{}{} [{}]", r.text, if r.defined { "" } else { " (undefined)" }, flags.join(" "))
}

fn read_request_text(r: &ReadRequestInfo) -> String {
    format!(
        "ReadReq sink 0x{:08x}/0x{:x} size {} source 0x{:08x}/0x{:x}",
        r.sink_stag, r.sink_to, r.size, r.source_stag, r.source_to
    )
}

fn segment_text(seg: &Segment) -> String {
    let mut s = format!("{} payload {}", header_text(&seg.header), seg.payload_len);
    match &seg.body {
        None => {}
        Some(Body::ReadRequest(r)) => s.push_str(&format!(" | {}", read_request_text(r))),
        Some(Body::ImmediateData { data }) => s.push_str(&format!(" | data 0x{data:016x}")),
        Some(Body::AtomicRequest(a)) => s.push_str(&format!(
            " | {} id {} remote 0x{:08x}/0x{:x} add/swap 0x{:x} mask 0x{:x} compare 0x{:x} mask 0x{:x}",
            a.op_name,
            a.request_id,
            a.remote_stag,
            a.remote_to,
            a.add_swap_data,
            a.add_swap_mask,
            a.compare_data,
            a.compare_mask
        )),
        Some(Body::AtomicResponse { request_id, original }) => {
            s.push_str(&format!(" | id {request_id} original 0x{original:x}"))
        }
        Some(Body::Terminate(t)) => {
            s.push_str(&format!(" | RFC reading: {}", reading_text(&t.rfc)));
            if let Some(w) = &t.siw {
                s.push_str(&format!("; siw reading: {}", reading_text(w)));
            }
            s.push_str(&format!("; decoded with the {} reading", t.used));
            if let Some(n) = t.segment_len {
                s.push_str(&format!("; segment length {n}"));
            }
            if let Some(h) = &t.ddp_header {
                s.push_str(&format!("; terminated DDP header: {}", header_text(h)));
            }
            if let Some(r) = &t.read_request {
                s.push_str(&format!("; terminated {}", read_request_text(r)));
            }
        }
    }
    s
}

fn hexdump(out: &mut String, bytes: &[u8]) {
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("      {:04x}  {}\n", i * 16, hex.join(" ")));
    }
}

fn connection(out: &mut String, c: &Connection, verbose: bool) {
    if !c.mpa {
        out.push_str(&format!("conn {} {} -> {} (TCP, no MPA)\n", c.id, c.initiator, c.responder));
        return;
    }
    out.push_str(&format!("conn {} {} -> {} (initiator -> responder)\n", c.id, c.initiator, c.responder));
    if let Some(r) = &c.request {
        out.push_str(&frame_line("Request", r));
        out.push('\n');
    }
    if let Some(r) = &c.reply {
        out.push_str(&frame_line("Reply", r));
        out.push('\n');
    }
    if let Some(n) = &c.negotiated {
        let on = |b: bool| if b { "on" } else { "off" };
        if n.rejected {
            out.push_str("  negotiated: REJECTED by the responder\n");
        } else {
            out.push_str(&format!(
                "  negotiated: CRC {}, markers {}/{} (i->r/r->i), RTR {}\n",
                on(n.crc),
                on(n.markers_to_responder),
                on(n.markers_to_initiator),
                n.rtr.unwrap_or("none")
            ));
        }
    }
    for f in &c.fpdus {
        out.push_str(&fpdu_line(f));
        out.push('\n');
        if verbose && let Some(u) = &f.ulpdu {
            hexdump(out, u);
        }
    }
}

fn text(args: &Args, report: &Report) -> String {
    let mut out = format!("{}: {}, {} packets\n", args.file.display(), report.format, report.packets);
    for c in &report.connections {
        connection(&mut out, c, args.verbose);
    }
    if !report.notes.is_empty() {
        out.push_str("notes:\n");
        for n in &report.notes {
            out.push_str(&format!("  {n}\n"));
        }
    }
    out.push_str(&format!(
        "{} MPA connections, {} FPDUs, {} violations\n",
        report.mpa_connections(),
        report.fpdus(),
        report.violations.len()
    ));
    for v in &report.violations {
        out.push_str(&format!("  violation: {v}\n"));
    }
    out
}
