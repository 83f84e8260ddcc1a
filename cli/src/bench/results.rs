//! What a benchmark measures and reports: the operations, a measurement's budget, bandwidth
//! and latency figures (latency from an HDR histogram), one row of results and its ratios.

use std::fmt;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An operation to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Op {
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// Send / Receive.
    Send,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
        }
    }
}

/// A measurement failure.
#[derive(Debug)]
pub(crate) struct BenchError(pub(crate) String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

/// How long one measurement runs: a number of iterations, or a duration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub(crate) iters: Option<u64>,
    pub(crate) duration: Duration,
}

impl Budget {
    /// Whether `n` iterations begun at `start` spend the budget.
    pub(crate) fn spent(&self, n: u64, start: Instant) -> bool {
        match self.iters {
            Some(iters) => n >= iters,
            None => start.elapsed() >= self.duration,
        }
    }
}

/// A bandwidth measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    pub(crate) msgs: u64,
    pub(crate) bytes: u64,
    pub(crate) secs: f64,
}

impl Throughput {
    pub(crate) fn gbyte_s(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9) / 1e9
    }

    pub(crate) fn mmsg_s(&self) -> f64 {
        self.msgs as f64 / self.secs.max(1e-9) / 1e6
    }

    /// Two measurements as one: their messages, bytes and times added.
    pub(crate) fn plus(self, o: Throughput) -> Throughput {
        Throughput { msgs: self.msgs + o.msgs, bytes: self.bytes + o.bytes, secs: self.secs + o.secs }
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "gbyte_s": self.gbyte_s(),
            "gbit_s": self.gbyte_s() * 8.0,
            "mmsg_s": self.mmsg_s(),
            "msgs": self.msgs,
            "bytes": self.bytes,
            "secs": self.secs,
        })
    }
}

/// Round-trip times as they are measured, in a histogram of bounded size (3 significant
/// digits from 1 ns to a minute), however long the run.
pub(crate) struct Samples {
    pub(crate) hist: Option<hdrhistogram::Histogram<u64>>,
    pub(crate) n: usize,
}

impl Samples {
    pub(crate) fn new() -> Samples {
        Samples { hist: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).ok(), n: 0 }
    }

    /// Records one round trip.
    pub(crate) fn push(&mut self, d: Duration) {
        self.n += 1;
        if let Some(h) = &mut self.hist {
            h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
        }
    }

    /// Round trips recorded.
    pub(crate) fn len(&self) -> usize {
        self.n
    }
}

/// Round-trip times of a ping-pong.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Latency {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) max_us: f64,
    pub(crate) samples: usize,
}

impl Latency {
    pub(crate) fn from_samples(samples: Samples) -> Latency {
        let Some(h) = samples.hist else { return Latency { samples: samples.n, ..Latency::default() } };
        let us = |ns: u64| ns as f64 / 1e3;
        Latency {
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            samples: samples.n,
        }
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "p999_us": self.p999_us,
            "max_us": self.max_us,
            "samples": self.samples,
        })
    }
}

/// What the frames of a smoltcp stream cost: frames through the two devices (sent and
/// received) and the process's CPU time (every thread) over the measurement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameCost {
    pub(crate) frames: u64,
    pub(crate) cpu_secs: f64,
    pub(crate) secs: f64,
}

impl FrameCost {
    /// Frames per second of wall time.
    pub(crate) fn per_sec(&self) -> f64 {
        self.frames as f64 / self.secs.max(1e-9)
    }

    /// Frames per CPU-second: per core kept busy.
    pub(crate) fn per_cpu_sec(&self) -> f64 {
        self.frames as f64 / self.cpu_secs.max(1e-9)
    }

    pub(crate) fn to_json(self) -> Value {
        json!({
            "frames": self.frames,
            "frames_per_s": self.per_sec(),
            "frames_per_cpu_s": self.per_cpu_sec(),
            "cpu_s": self.cpu_secs,
            "secs": self.secs,
        })
    }
}

/// One size of the raw-TCP baseline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRow {
    pub(crate) stream: Throughput,
    pub(crate) ping_pong: Latency,
    /// The turns the ping-pong took with this stack's (`--interleave`), or `None` when it
    /// was measured apart.
    pub(crate) ping_pong_turns: Option<u64>,
    /// smoltcp runs: what the stream's frames cost.
    pub(crate) frames: Option<FrameCost>,
    /// Kernel TCP over 127.0.0.1 with `--qps` above 1: the stream spread over as many
    /// connections (see `raw::streams`).
    pub(crate) conns: Option<Throughput>,
}

/// One operation at one size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) op: Op,
    pub(crate) size: usize,
    pub(crate) bw: Throughput,
    pub(crate) lat: Latency,
    pub(crate) raw: RawRow,
    /// smoltcp runs: the kernel-TCP stream (over the same veth pair, or 127.0.0.1), for
    /// comparison.
    pub(crate) kernel: Option<Throughput>,
    /// Writes with `--qps` above 1: the same Writes over the first queue pair alone, the
    /// whole window on it, in the same run (`Bench::throughput_one`).
    pub(crate) one_qp: Option<Throughput>,
    /// Writes with `--qps` above 1: how the ratios of the aggregate spread over the rounds
    /// it was measured in, taking turns with one queue pair (and raw TCP over as many
    /// connections).
    pub(crate) rounds: Option<Rounds>,
}

/// The spread of a ratio over rounds: lowest, median, highest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spread {
    pub(crate) min: f64,
    pub(crate) median: f64,
    pub(crate) max: f64,
}

impl Spread {
    /// `None` for no values.
    pub(crate) fn of(mut values: Vec<f64>) -> Option<Spread> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => values[n / 2],
            _ => f64::midpoint(values[n / 2 - 1], values[n / 2]),
        };
        Some(Spread { min: values[0], median, max: values[n - 1] })
    }

    pub(crate) fn to_json(self) -> Value {
        json!({ "min": self.min, "median": self.median, "max": self.max })
    }
}

/// The rounds of a Write measurement over several queue pairs: in each, the aggregate, one
/// queue pair and (where measured alike) raw TCP over as many connections, in turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    pub(crate) n: usize,
    /// The aggregate against one queue pair, round by round.
    pub(crate) one_qp: Spread,
    /// The aggregate against raw TCP over as many connections, round by round.
    pub(crate) conns: Option<Spread>,
}

pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

impl Row {
    pub(crate) fn bw_ratio(&self) -> f64 {
        ratio(self.bw.gbyte_s(), self.raw.stream.gbyte_s())
    }

    pub(crate) fn rate_ratio(&self) -> f64 {
        ratio(self.bw.mmsg_s(), self.raw.stream.mmsg_s())
    }

    /// Against the raw stream over as many connections as queue pairs, where measured.
    pub(crate) fn conns_ratio(&self) -> Option<f64> {
        self.raw.conns.map(|c| ratio(self.bw.gbyte_s(), c.gbyte_s()))
    }

    /// The aggregate over all queue pairs against one queue pair's, where measured.
    pub(crate) fn one_qp_ratio(&self) -> Option<f64> {
        self.one_qp.map(|o| ratio(self.bw.gbyte_s(), o.gbyte_s()))
    }

    pub(crate) fn lat_ratio(&self) -> f64 {
        ratio(self.lat.p50_us, self.raw.ping_pong.p50_us)
    }
}

/// 64, 256, 1K, 4K, 1M, 1.5K...
pub(crate) fn show_size(size: usize) -> String {
    for (unit, name) in [(1usize << 30, "G"), (1 << 20, "M"), (1 << 10, "K")] {
        if size >= unit && size.is_multiple_of(unit) {
            return format!("{}{name}", size / unit);
        }
    }
    size.to_string()
}

#[cfg(test)]
mod spread_tests {
    use super::Spread;

    #[test]
    fn a_spread_is_the_lowest_the_median_and_the_highest() {
        assert_eq!(Spread::of(vec![]), None);
        assert_eq!(Spread::of(vec![0.5]), Some(Spread { min: 0.5, median: 0.5, max: 0.5 }));
        assert_eq!(Spread::of(vec![0.9, 0.1, 0.5]), Some(Spread { min: 0.1, median: 0.5, max: 0.9 }));
        assert_eq!(Spread::of(vec![0.4, 0.8, 0.2, 0.6]), Some(Spread { min: 0.2, median: 0.5, max: 0.8 }));
    }
}
