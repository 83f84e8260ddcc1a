//! Packet-capture analysis: find the iWARP connections in a pcap/pcapng file and decode them.
//!
//! The pipeline: [`capture`] reads the file into packets, [`tcp`] decodes Ethernet/IP/TCP and
//! reassembles both directions of each TCP connection, and [`mpa`] finds the MPA
//! Request/Reply at the start of each connection's streams, then deframes every FPDU with the
//! negotiated CRC and marker settings, and [`ddp`] decodes each ULPDU as a DDP segment with
//! its RDMAP message (Read Request, Terminate, RFC 7306 bodies) and follows the message
//! sequence of each direction.
//!
//! The records come out as they are decoded, to a [`Sink`] ([`dissect_to`]): the capture, then
//! each connection followed by its FPDUs (both directions, in the order of the frames that
//! completed them) with the violations and notes about them, and at the end a [`Summary`] of
//! the counts. Memory stays proportional to the capture (its bytes and the reassembled TCP
//! streams), not to the number of FPDUs: `iwarp dissect` prints each record as it comes.
//! [`dissect`] collects everything into a [`Report`] instead: plain data (serializable with
//! serde), for tests and small captures.
//!
//! Findings come in two strengths: a [`Violation`] is a protocol error on the wire (a bad CRC,
//! a bad marker, a malformed frame, FPDU or DDP segment, an MSN gap, an MO jump, a Read
//! Response that does not match its request, a missing RTR, a responder that sends first);
//! a [`Note`] is something worth knowing that is not the peers' fault (a capture that starts
//! mid-connection or is truncated, a gap).
//!
//! ```no_run
//! let report = iwarp_dissect::dissect_file("trace.pcap".as_ref(), &Default::default()).unwrap();
//! println!("{} MPA connections, {} violations", report.mpa_connections(), report.violations.len());
//!
//! // Streaming: count the FPDUs without keeping them.
//! struct Count(usize);
//! impl iwarp_dissect::Sink for Count {
//!     fn fpdu(&mut self, _conn: usize, _fpdu: &iwarp_dissect::FpduInfo) {
//!         self.0 += 1;
//!     }
//! }
//! let bytes = std::fs::read("trace.pcap").unwrap();
//! let mut count = Count(0);
//! let summary = iwarp_dissect::dissect_to(&bytes, &Default::default(), &mut count).unwrap();
//! assert_eq!(count.0, summary.fpdus);
//! ```

pub mod capture;
pub mod check;
pub mod ddp;
pub mod mpa;
mod record;
pub mod tcp;

use record::violation_summary;
pub use record::*;

use std::path::Path;

use serde::Serialize;

/// Forwards records to a sink and counts them.
struct Counting<'a, S: ?Sized> {
    sink: &'a mut S,
    summary: Summary,
}

impl<S: Sink + ?Sized> Sink for Counting<'_, S> {
    fn capture(&mut self, capture: &CaptureInfo) {
        self.sink.capture(capture);
    }

    fn connection(&mut self, conn: &Connection) {
        self.summary.connections += 1;
        self.summary.mpa_connections += usize::from(conn.mpa);
        self.sink.connection(conn);
    }

    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        self.summary.fpdus += 1;
        self.sink.fpdu(conn, fpdu);
    }

    fn violation(&mut self, violation: &Violation) {
        self.summary.violations += 1;
        *self.summary.violation_counts.entry(violation.kind).or_insert(0) += 1;
        self.sink.violation(violation);
    }

    fn note(&mut self, note: &Note) {
        self.summary.notes += 1;
        self.sink.note(note);
    }
}

/// The result of dissecting a capture, every record kept (see [`dissect`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// pcap or pcapng.
    pub format: capture::Format,
    /// Packets read.
    pub packets: usize,
    /// Set when the file ended early or was damaged.
    pub truncated: Option<capture::Truncation>,
    /// Every TCP connection, in order of first appearance.
    pub connections: Vec<Connection>,
    /// Protocol errors.
    pub violations: Vec<Violation>,
    /// Everything else worth knowing.
    pub notes: Vec<Note>,
}

impl Report {
    /// Number of connections that carry MPA.
    pub fn mpa_connections(&self) -> usize {
        self.connections.iter().filter(|c| c.mpa).count()
    }

    /// Number of FPDUs over all connections.
    pub fn fpdus(&self) -> usize {
        self.connections.iter().map(|c| c.fpdus.len()).sum()
    }

    /// Violations counted by kind, in [`ViolationKind`] order.
    pub fn violation_counts(&self) -> Vec<(ViolationKind, usize)> {
        let mut counts = std::collections::BTreeMap::new();
        for v in &self.violations {
            *counts.entry(v.kind).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    /// "3 violations (2 bad CRC, 1 malformed frame)", or `None` without violations.
    pub fn violation_summary(&self) -> Option<String> {
        violation_summary(&self.violation_counts())
    }
}

/// Collects the records.
impl Sink for Report {
    fn capture(&mut self, capture: &CaptureInfo) {
        self.format = capture.format;
        self.packets = capture.packets;
        self.truncated.clone_from(&capture.truncated);
    }

    fn connection(&mut self, conn: &Connection) {
        self.connections.push(conn.clone());
    }

    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        if let Some(c) = self.connections.iter_mut().rev().find(|c| c.id == conn) {
            c.fpdus.push(fpdu.clone());
        }
    }

    fn violation(&mut self, violation: &Violation) {
        self.violations.push(violation.clone());
    }

    fn note(&mut self, note: &Note) {
        self.notes.push(note.clone());
    }
}

/// Dissects a capture held in memory, handing each record to `sink` as it is decoded; returns
/// the counts. Memory: the capture's packets and the reassembled TCP streams, plus one FPDU
/// being decoded and the sequence state of each connection (see [`check::Checker`]).
pub fn dissect_to<S: Sink + ?Sized>(
    bytes: &[u8],
    options: &Options,
    sink: &mut S,
) -> Result<Summary, DissectError> {
    let cap = capture::parse(bytes).map_err(|_| DissectError::NotACapture)?;
    let mut out = Counting { sink, summary: Summary::default() };
    let mut tracker = tcp::Tracker::new();
    let mut malformed = 0usize;
    let mut unsupported = std::collections::BTreeSet::new();
    for p in &cap.packets {
        match tcp::decode(p) {
            tcp::Decoded::Tcp(seg) => tracker.handle_segment(&seg),
            tcp::Decoded::Other => {}
            tcp::Decoded::UnsupportedLink(l) => {
                unsupported.insert(l);
            }
            tcp::Decoded::Malformed(_) => malformed += 1,
        }
    }
    out.capture(&CaptureInfo {
        format: cap.format,
        packets: cap.packets.len(),
        truncated: cap.truncated.clone(),
    });
    let note = |out: &mut Counting<'_, S>, message: String| out.note(&Note { conn: None, message });
    for l in unsupported {
        note(&mut out, format!("packets with unsupported link type {l} skipped"));
    }
    if malformed > 0 {
        note(&mut out, format!("{malformed} packets with undecodable headers skipped"));
    }
    if let Some(t) = &cap.truncated {
        note(&mut out, t.to_string());
    }
    for (i, conn) in tracker.into_connections().iter().enumerate() {
        mpa::analyse(i + 1, conn, options, &mut out);
    }
    if out.summary.mpa_connections == 0 {
        note(&mut out, "no MPA connection found".to_string());
    }
    Ok(out.summary)
}

/// Dissects a capture held in memory and keeps every record in a [`Report`].
pub fn dissect(bytes: &[u8], options: &Options) -> Result<Report, DissectError> {
    let mut report = Report {
        format: capture::Format::Pcap,
        packets: 0,
        truncated: None,
        connections: Vec::new(),
        violations: Vec::new(),
        notes: Vec::new(),
    };
    dissect_to(bytes, options, &mut report)?;
    Ok(report)
}

/// Reads and dissects a capture file into a [`Report`].
pub fn dissect_file(path: &Path, options: &Options) -> Result<Report, DissectError> {
    let bytes = std::fs::read(path).map_err(DissectError::Io)?;
    dissect(&bytes, options)
}

/// Reads a capture file and dissects it into `sink` (see [`dissect_to`]).
pub fn dissect_file_to<S: Sink + ?Sized>(
    path: &Path,
    options: &Options,
    sink: &mut S,
) -> Result<Summary, DissectError> {
    let bytes = std::fs::read(path).map_err(DissectError::Io)?;
    dissect_to(&bytes, options, sink)
}

/// Checks the records of a dissection as they come (see [`fuzz_dissect`]).
#[derive(Default)]
struct FuzzCheck {
    summary: Summary,
    /// The connection being reported and whether it carries MPA.
    current: Option<(usize, bool)>,
    /// Per direction of the current connection: the last FPDU index and the end of the last
    /// FPDU in the stream.
    last: [(usize, u64); 2],
}

impl Sink for FuzzCheck {
    fn connection(&mut self, conn: &Connection) {
        let expected = self.current.map_or(1, |(id, _)| id + 1);
        assert_eq!(conn.id, expected, "connections are numbered in order");
        assert!(conn.fpdus.is_empty(), "a connection record comes before its FPDUs");
        self.current = Some((conn.id, conn.mpa));
        self.last = [(0, 0); 2];
        self.summary.connections += 1;
    }

    fn fpdu(&mut self, conn: usize, f: &FpduInfo) {
        assert_eq!(self.current, Some((conn, true)), "an FPDU of the MPA connection just reported");
        let last = &mut self.last[usize::from(f.dir == Dir::ResponderToInitiator)];
        assert!(f.index > last.0, "FPDU #{} after #{}", f.index, last.0);
        assert!(f.offset >= last.1, "FPDU at {} overlaps the previous one (ends at {})", f.offset, last.1);
        *last = (f.index, f.offset + f.wire_len as u64);
        let content = iwarp_mpa::fpdu::fpdu_len(f.ulpdu_len);
        assert_eq!(f.pad, iwarp_mpa::fpdu::pad_len(f.ulpdu_len));
        assert_eq!(f.wire_len, content + 4 * f.markers.len(), "markers are inside the FPDU");
        assert_eq!(f.ulpdu.as_ref().map(Vec::len), Some(f.ulpdu_len), "the kept ULPDU is the ULPDU");
        assert_eq!(f.ddp.is_some(), f.ulpdu_len >= 2);
        if f.segment.is_some() {
            assert!(f.ddp.is_some() && !matches!(f.crc, CrcVerdict::Bad { .. }));
        }
        self.summary.fpdus += 1;
    }

    fn violation(&mut self, v: &Violation) {
        assert_eq!(
            Some(v.conn),
            self.current.map(|(id, _)| id),
            "a violation of the connection just reported"
        );
        self.summary.violations += 1;
    }

    fn note(&mut self, _: &Note) {
        self.summary.notes += 1;
    }
}

/// Fuzz entry point (fuzz/fuzz_targets/dissect.rs): dissects `bytes` as a capture file (capture
/// parsing, TCP reassembly, MPA, DDP and RDMAP decoding, ULPDUs kept) and checks the records
/// as they stream out: connections numbered in order, each FPDU after its connection's record,
/// FPDU indices increasing and FPDUs not overlapping within a direction, lengths, pad and
/// markers consistent, and counts that match the [`Summary`]. Panics only on a bug; returns
/// the summary (`None` when the bytes are not a capture).
#[doc(hidden)]
pub fn fuzz_dissect(bytes: &[u8]) -> Option<Summary> {
    let mut check = FuzzCheck::default();
    let summary = dissect_to(bytes, &Options { keep_ulpdu: true }, &mut check).ok()?;
    let seen =
        (check.summary.connections, check.summary.fpdus, check.summary.violations, check.summary.notes);
    assert_eq!(seen, (summary.connections, summary.fpdus, summary.violations, summary.notes));
    assert_eq!(summary.violation_counts.values().sum::<usize>(), summary.violations);
    Some(summary)
}
