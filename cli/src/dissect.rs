//! `iwarp dissect FILE`: decode the MPA traffic of a capture.

use crate::toolbox::io_message;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use iwarp_dissect::ddp::{Body, DdpHeader, Model, ReadRequestInfo, Segment, TerminateReading};
use iwarp_dissect::{
    self as dissect, CaptureInfo, Connection, DissectError, FpduInfo, FrameInfo, Note, Options, Sink,
    Summary, Violation,
};

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
/// positions, DDP header, RDMAP opcode and body), one line each, with violations and notes
/// where they are found and a summary line at the end. Output is streamed: memory stays
/// proportional to the capture, however many FPDUs it holds.
///
/// Exit status: 0 when everything decoded cleanly, 1 when there were protocol violations (bad
/// CRC or marker, malformed frame or segment, MSN/MO sequence errors, a Read Response that
/// does not match its request, a responder sending first; a one-line summary goes to stderr),
/// 2 when the file could not be read or is not a capture.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The capture file (pcap or pcapng).
    file: PathBuf,
    /// Print JSON Lines: one JSON object per record, its kind in "record": "capture" first,
    /// then "connection", "fpdu", "violation" and "note" records as they are decoded, and
    /// "summary" (the counts) last.
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
    let bytes = match std::fs::read(&args.file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot open {shown}: {}", io_message(&e));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let mut out = Output { w: BufWriter::new(std::io::stdout().lock()), failed: None };
    let file = shown.to_string();
    let result = if args.json {
        let mut sink = JsonLines { out: &mut out, file: &file };
        dissect::dissect_to(&bytes, &options, &mut sink).inspect(|summary| sink.summary(summary))
    } else {
        let mut sink = Text { out: &mut out, file: &file, verbose: args.verbose };
        dissect::dissect_to(&bytes, &options, &mut sink).inspect(|summary| sink.summary(summary))
    };
    let summary = match result {
        Ok(s) => s,
        Err(DissectError::Io(e)) => {
            eprintln!("error: cannot read {shown}: {}", io_message(&e));
            return ExitCode::from(EXIT_ERROR);
        }
        Err(DissectError::NotACapture) => {
            eprintln!("error: {shown} is not a pcap or pcapng capture");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    out.flush();
    if let Some(e) = out.failed.filter(|e| e.kind() != std::io::ErrorKind::BrokenPipe) {
        eprintln!("error: cannot write the output: {}", io_message(&e));
        return ExitCode::from(EXIT_ERROR);
    }
    match summary.violation_summary() {
        Some(s) => {
            eprintln!("dissect: {s}");
            ExitCode::from(EXIT_VIOLATIONS)
        }
        None => ExitCode::SUCCESS,
    }
}

/// Standard output, buffered; after the first write error (a closed pipe: `| head`) the rest is
/// dropped.
struct Output<W: Write> {
    w: W,
    failed: Option<std::io::Error>,
}

impl<W: Write> Output<W> {
    fn line(&mut self, s: &str) {
        if self.failed.is_none()
            && let Err(e) = self.w.write_all(s.as_bytes()).and_then(|()| self.w.write_all(b"\n"))
        {
            self.failed = Some(e);
        }
    }

    fn flush(&mut self) {
        if self.failed.is_none()
            && let Err(e) = self.w.flush()
        {
            self.failed = Some(e);
        }
    }
}

/// One JSON Lines record.
#[derive(serde::Serialize)]
#[serde(tag = "record", rename_all = "snake_case")]
enum Record<'a> {
    Capture {
        file: &'a str,
        #[serde(flatten)]
        info: &'a CaptureInfo,
    },
    Connection(&'a Connection),
    Fpdu {
        conn: usize,
        #[serde(flatten)]
        fpdu: &'a FpduInfo,
    },
    Violation(&'a Violation),
    Note(&'a Note),
    Summary(&'a Summary),
}

/// `--json`: one record a line.
struct JsonLines<'a, W: Write> {
    out: &'a mut Output<W>,
    file: &'a str,
}

impl<W: Write> JsonLines<'_, W> {
    fn record(&mut self, r: &Record<'_>) {
        match serde_json::to_string(r) {
            Ok(s) => self.out.line(&s),
            // The records are plain data: serde_json cannot fail on them.
            Err(e) => self.out.line(&format!("{{\"record\":\"error\",\"message\":\"{e}\"}}")),
        }
    }

    fn summary(&mut self, s: &Summary) {
        self.record(&Record::Summary(s));
    }
}

impl<W: Write> Sink for JsonLines<'_, W> {
    fn capture(&mut self, info: &CaptureInfo) {
        self.record(&Record::Capture { file: self.file, info });
    }

    fn connection(&mut self, conn: &Connection) {
        self.record(&Record::Connection(conn));
    }

    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        self.record(&Record::Fpdu { conn, fpdu });
    }

    fn violation(&mut self, v: &Violation) {
        self.record(&Record::Violation(v));
    }

    fn note(&mut self, n: &Note) {
        self.record(&Record::Note(n));
    }
}

/// Text: one line per record.
struct Text<'a, W: Write> {
    out: &'a mut Output<W>,
    file: &'a str,
    verbose: bool,
}

impl<W: Write> Text<'_, W> {
    fn summary(&mut self, s: &Summary) {
        self.out.line(&format!(
            "{} MPA connections, {} FPDUs, {} violations",
            s.mpa_connections, s.fpdus, s.violations
        ));
    }
}

impl<W: Write> Sink for Text<'_, W> {
    fn capture(&mut self, info: &CaptureInfo) {
        self.out.line(&format!("{}: {}, {} packets", self.file, info.format, info.packets));
    }

    fn connection(&mut self, conn: &Connection) {
        let mut s = String::new();
        connection(&mut s, conn);
        // `connection` ends every line with a newline; `line` adds the last one.
        self.out.line(s.trim_end_matches('\n'));
    }

    fn fpdu(&mut self, _conn: usize, f: &FpduInfo) {
        self.out.line(&fpdu_line(f));
        if self.verbose
            && let Some(u) = &f.ulpdu
        {
            let mut s = String::new();
            hexdump(&mut s, u);
            if !s.is_empty() {
                self.out.line(s.trim_end_matches('\n'));
            }
        }
    }

    fn violation(&mut self, v: &Violation) {
        self.out.line(&format!("  violation: {v}"));
    }

    fn note(&mut self, n: &Note) {
        self.out.line(&format!("  note: {n}"));
    }
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

fn connection(out: &mut String, c: &Connection) {
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
}
