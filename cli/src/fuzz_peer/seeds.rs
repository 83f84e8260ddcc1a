//! Seed ULPDUs from captures (`--seed-pcap`): the dissector (dissect/src/) reads the file,
//! reassembles every TCP connection and deframes every FPDU; its ULPDUs, both directions,
//! become templates that cases mutate.

use std::path::Path;

use iwarp_dissect::{self as dissect, DissectError, Options};

/// At most this many distinct seeds are kept.
const MAX_SEEDS: usize = 4096;

/// The distinct ULPDUs of the captures, in order of appearance; an error names the file.
pub(crate) fn load(paths: &[impl AsRef<Path>]) -> Result<Vec<Vec<u8>>, String> {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for path in paths {
        let path = path.as_ref();
        let shown = path.display();
        let report = dissect::dissect_file(path, &Options { keep_ulpdu: true }).map_err(|e| match e {
            DissectError::Io(e) => format!("cannot open {shown}: {}", crate::toolbox::io_message(&e)),
            DissectError::NotACapture => format!("{shown} is not a pcap or pcapng capture"),
        })?;
        let mut fpdus = 0;
        for u in report.connections.iter().flat_map(|c| &c.fpdus).filter_map(|f| f.ulpdu.as_ref()) {
            fpdus += 1;
            if seeds.len() < MAX_SEEDS && seen.insert(u.clone()) {
                seeds.push(u.clone());
            }
        }
        if fpdus == 0 {
            return Err(format!("{shown} holds no FPDU to seed cases from"));
        }
    }
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> std::path::PathBuf {
        // The tests crate's captures, tests/data/siw/ at the workspace root.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".."));
        root.join("tests/data/siw").join(name)
    }

    #[test]
    fn seeds_from_siw_captures() {
        let s = load(&[data("siw-rping.pcap"), data("siw-read-bw.pcap")]).unwrap();
        assert!(s.len() > 10, "{}", s.len());
        // rping's first Send, a Read Request and a Read Response are among them.
        assert!(s.iter().any(|u| u.starts_with(&[0x41, 0x43]) && u.len() == 18 + 16));
        assert!(s.iter().any(|u| u.starts_with(&[0x41, 0x41]) && u.len() == 18 + 28));
        assert!(s.iter().any(|u| u.starts_with(&[0xc1, 0x42])));
        let distinct: std::collections::HashSet<&Vec<u8>> = s.iter().collect();
        assert_eq!(distinct.len(), s.len());
        let e = load(&[data("missing.pcap")]).unwrap_err();
        assert!(e.starts_with("cannot open ") && e.ends_with("No such file or directory"), "{e}");
        let e = load(&[data("README.md")]).unwrap_err();
        assert!(e.ends_with("is not a pcap or pcapng capture"), "{e}");
        let e = load(&[data("rxe-rping.pcap")]).unwrap_err();
        assert!(e.ends_with("holds no FPDU to seed cases from"), "{e}");
    }
}
