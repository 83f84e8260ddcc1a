//! The guest-console oracle: a kernel's serial log (tests/interop/lib.sh writes the guest's to
//! `serial.log`) must show no Oops, BUG, WARN, KASAN or similar line.

use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

/// What marks a kernel crash or warning on the console (the markers `iw_guest_crashed` in
/// tests/interop/lib.sh looks for, and WARN/KASAN/UBSAN reports).
const MARKERS: [&str; 10] = [
    "Oops",
    "BUG: ",
    "kernel BUG at",
    "WARNING: ",
    "KASAN",
    "UBSAN",
    "invalid opcode:",
    "general protection fault",
    "Kernel panic",
    "Call Trace:",
];

/// Reads a console log as it grows.
#[derive(Debug)]
pub(crate) struct Console {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Console {
    /// Watches `path` from its start (it must exist).
    pub(crate) fn open(path: &Path) -> io::Result<Console> {
        std::fs::metadata(path)?;
        Ok(Console { path: path.to_path_buf(), offset: 0, partial: Vec::new() })
    }

    /// The first new line that shows a crash or warning, if one was written since the last call.
    pub(crate) fn check(&mut self) -> io::Result<Option<String>> {
        let mut f = std::fs::File::open(&self.path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            // The log was replaced: start over.
            self.offset = 0;
            self.partial.clear();
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut new = Vec::new();
        f.take(len - self.offset).read_to_end(&mut new)?;
        self.offset += new.len() as u64;
        self.partial.extend_from_slice(&new);
        let mut found = None;
        let end = self.partial.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        for line in self.partial[..end].split(|b| *b == b'\n') {
            let text = String::from_utf8_lossy(line);
            if found.is_none() && MARKERS.iter().any(|m| text.contains(m)) {
                found = Some(text.trim_end().to_string());
            }
        }
        self.partial.drain(..end);
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_new_crash_lines_only() {
        let p = std::env::temp_dir().join(format!("iwarp-console-{}", std::process::id()));
        std::fs::write(&p, "IWARP-GUEST-UP\nsiw: received unknown packet type 12\n").unwrap();
        let mut c = Console::open(&p).unwrap();
        assert_eq!(c.check().unwrap(), None);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        use std::io::Write as _;
        f.write_all(b"[  12.5] invalid opcode: 0000 [#1] PREEMPT SMP\n[  12.5] RIP: cm_work_ha").unwrap();
        assert_eq!(c.check().unwrap().as_deref(), Some("[  12.5] invalid opcode: 0000 [#1] PREEMPT SMP"));
        assert_eq!(c.check().unwrap(), None);
        f.write_all(b"ndler\n[  13.0] WARNING: CPU: 0 PID: 7 at x\n").unwrap();
        assert_eq!(c.check().unwrap().as_deref(), Some("[  13.0] WARNING: CPU: 0 PID: 7 at x"));
        let _ = std::fs::remove_file(&p);
        assert!(Console::open(&p).is_err());
    }
}
