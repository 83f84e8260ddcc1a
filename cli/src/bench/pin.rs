//! `--pin CLIENT,SERVER`: each end's threads on a CPU of its own, the raw-TCP baseline's too,
//! so that the two ends run as on two hosts: neither end's thread can preempt the other's, and
//! a message that wakes the peer wakes it on the peer's CPU. Without it the scheduler places
//! the threads of both ends on the machine's CPUs as it likes, and on a small machine it often
//! runs the thread a message woke on the sender's CPU, ahead of the sender (see
//! docs/architecture.md, "What a message costs on the way").
//!
//! The client's end is the calling thread (the bench's own) and its device's engine thread; the
//! server's end is its device's engine thread, the `bench-server` thread and the raw baseline's
//! `raw-tcp-server` threads. An engine thread inherits the CPUs of the thread that opened its
//! device, so the server's device is opened on a thread pinned to the server's CPU.

use std::sync::OnceLock;

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// The two CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    pub(crate) client: usize,
    pub(crate) server: usize,
}

/// The pinning of this run, once set.
static PINNED: OnceLock<Pin> = OnceLock::new();

/// Parses `CLIENT,SERVER`: two CPU numbers (the same one twice puts both ends on one CPU).
pub(crate) fn parse(s: &str) -> Result<Pin, String> {
    let bad = || format!("'{s}' is not two CPU numbers CLIENT,SERVER (e.g. 0,1)");
    let (c, v) = s.split_once(',').ok_or_else(bad)?;
    let cpu = |t: &str| t.trim().parse::<usize>().map_err(|_| bad());
    Ok(Pin { client: cpu(c)?, server: cpu(v)? })
}

/// Checks that this process may run on both CPUs, then pins the calling thread to the
/// client's CPU and remembers the pinning for [`server_side`] and [`on_server_cpu`].
pub(super) fn set(pin: Pin) -> Result<(), String> {
    let allowed =
        sched_getaffinity(None).map_err(|e| format!("--pin: cannot read this process's CPUs: {e}"))?;
    for (end, cpu) in [("client", pin.client), ("server", pin.server)] {
        if cpu >= CpuSet::MAX_CPU || !allowed.is_set(cpu) {
            return Err(format!(
                "--pin: this process may not run on CPU {cpu} (the {end}'s); it may run on {}",
                list(&allowed)
            ));
        }
    }
    pin_to(pin.client)?;
    // A second run in one process (tests) keeps the first pinning's record.
    let _ = PINNED.set(pin);
    Ok(())
}

/// The pinning of this run, if any.
pub(super) fn pinned() -> Option<Pin> {
    PINNED.get().copied()
}

/// Pins the calling thread to the server's CPU, when the run is pinned. Failure is reported
/// and the thread goes on unpinned (the CPU was checked by [`set`]).
pub(super) fn server_side() {
    if let Some(p) = pinned()
        && let Err(e) = pin_to(p.server)
    {
        eprintln!("bench: {e}");
    }
}

/// Runs `f` on the server's CPU (on a thread of its own when the run is pinned), so that the
/// threads `f` starts, such as a device's engine, inherit that CPU.
pub(super) fn on_server_cpu<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, String> {
    if pinned().is_none() {
        return Ok(f());
    }
    std::thread::scope(|s| {
        let opener = std::thread::Builder::new().name("bench-open".into()).spawn_scoped(s, || {
            server_side();
            f()
        });
        opener
            .map_err(|e| format!("--pin: cannot start a thread on the server's CPU: {e}"))?
            .join()
            .map_err(|_| "--pin: the thread opening the server's device panicked".to_owned())
    })
}

fn pin_to(cpu: usize) -> Result<(), String> {
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).map_err(|e| format!("--pin: cannot pin a thread to CPU {cpu}: {e}"))
}

/// A CPU set as a list (`0-3,6`).
fn list(set: &CpuSet) -> String {
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// This process's threads now: each one's name and the CPUs it may run on (from
/// /proc/self/task), in the order of their thread ids.
pub(super) fn threads() -> Vec<(String, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut tasks: Vec<(u64, String, String)> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?.trim().to_owned();
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let cpus = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim().to_owned();
            Some((tid, name, cpus))
        })
        .collect();
    tasks.sort();
    tasks.into_iter().map(|(_, n, c)| (n, c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_two_cpus_and_refuses_anything_else() {
        assert_eq!(parse("0,1"), Ok(Pin { client: 0, server: 1 }));
        assert_eq!(parse(" 3 , 3 "), Ok(Pin { client: 3, server: 3 }));
        for bad in ["", "0", "0,", ",1", "a,b", "0,1,2", "-1,0"] {
            assert!(parse(bad).unwrap_err().contains("CLIENT,SERVER"), "{bad}");
        }
    }

    #[test]
    fn lists_cpu_sets_in_ranges() {
        let mut s = CpuSet::new();
        for c in [0, 1, 2, 5, 7, 8] {
            s.set(c);
        }
        assert_eq!(list(&s), "0-2,5,7-8");
        assert_eq!(list(&CpuSet::new()), "");
    }
}
