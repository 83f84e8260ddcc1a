//! The settings a program on the drop-in libraries runs with, from environment variables
//! (the program itself is unmodified, so there is nowhere else to put them). Read once, at
//! the first call that needs the device.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `IWARP_TRANSPORT` | `kernel` (the kernel's TCP), `smoltcp` (this stack's own TCP/IP) | `kernel` |
//! | `IWARP_TAP`, `IWARP_IFACE` | smoltcp: the TAP device, or the raw Ethernet interface | |
//! | `IWARP_IP` | smoltcp: the stack's address, `ADDR/PREFIX` | |
//! | `IWARP_MAC`, `IWARP_GATEWAY` | smoltcp: MAC address, default gateway | random, none |
//! | `IWARP_CRC` | `off`, `wanted`, `required`, `strict` (MPA CRC32c policy) | `off` |
//! | `IWARP_MPA_REV` | `1`, `2` | `2` |
//! | `IWARP_MARKERS` | `0`, `1` (ask the peer for MPA markers) | `0` |
//! | `IWARP_P2P` | `0`, `1` (peer-to-peer mode: offer RTR as initiator) | `0` |
//! | `IWARP_POLL` | `adaptive`, `busy`, `event` (the engine's poll mode) | `adaptive` |
//! | `IWARP_POLL_IDLE_US` | how long a thread's `ibv_poll_cq` calls may find nothing before it sleeps in the queue until a completion (0: always spin) | `200` |
//! | `IWARP_CONNECT_RETRY_MS` | how long `rdma_connect` retries a refused TCP connection (0: never) | `1000` |
//! | `IWARP_PCAP` | a file: every connection's traffic, as pcap | none |
//! | `IWARP_DEVICE` | the device's name (`ibv_get_device_name`) | `iwarp0` |
//! | `IWARP_LOG` | a `tracing` filter (`debug`, `iwarp=trace`, ...), to stderr | none |

use std::net::Ipv4Addr;
use std::path::PathBuf;

use iwarp::PollMode;
use iwarp::mpa::CrcPolicy;
use iwarp::netdev::SmolConfig;

/// Which device a smoltcp stack runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmolDevice {
    /// A TAP device (`IWARP_TAP`).
    Tap(String),
    /// A raw Ethernet interface (`IWARP_IFACE`).
    Raw(String),
}

/// The TCP/IP under MPA.
#[derive(Debug, Clone)]
pub enum TransportConfig {
    /// The kernel's TCP.
    Kernel,
    /// smoltcp on a TAP device or a raw interface.
    Smol(SmolDevice, SmolConfig),
}

/// The drop-in's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The device's name.
    pub device_name: String,
    /// The engine's poll mode.
    pub poll_mode: PollMode,
    /// The transport.
    pub transport: TransportConfig,
    /// MPA CRC policy.
    pub crc: CrcPolicy,
    /// MPA revision.
    pub mpa_rev: u8,
    /// Ask for markers.
    pub markers: bool,
    /// Peer-to-peer mode (RTR) as initiator.
    pub p2p: bool,
    /// How long a refused connection is retried (perftest's server closes its listener
    /// after the control connection and opens a new one a moment later; a client that is
    /// faster than that is refused).
    pub connect_retry: std::time::Duration,
    /// How long `ibv_poll_cq` may find nothing on a thread before that thread sleeps in the
    /// queue until a completion arrives; `None`: it always spins.
    pub poll_idle: Option<std::time::Duration>,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// `tracing` filter.
    pub log: Option<String>,
}

fn flag(name: &str, v: Option<String>) -> Result<bool, String> {
    match v.as_deref() {
        None | Some("" | "0" | "no" | "off" | "false") => Ok(false),
        Some("1" | "yes" | "on" | "true") => Ok(true),
        Some(other) => Err(format!("{name}={other}: expected 0 or 1")),
    }
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    (mac[0] & 1 == 0).then_some(mac)
}

impl Config {
    /// The settings from the process's environment.
    pub fn from_env() -> Result<Config, String> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// The settings from `get` (a variable's value, if set); a value that cannot be used is
    /// an error naming the variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let poll_mode = match get("IWARP_POLL").as_deref() {
            None | Some("" | "adaptive") => PollMode::Adaptive,
            Some("busy") => PollMode::Busy,
            Some("event") => PollMode::Event,
            Some(other) => return Err(format!("IWARP_POLL={other}: expected adaptive, busy or event")),
        };
        let crc = match get("IWARP_CRC").as_deref() {
            None | Some("" | "off" | "0") => CrcPolicy::Off,
            Some("wanted" | "on" | "1") => CrcPolicy::Wanted,
            Some("required") => CrcPolicy::Required,
            Some("strict") => CrcPolicy::Strict,
            Some(other) => {
                return Err(format!("IWARP_CRC={other}: expected off, wanted, required or strict"));
            }
        };
        let mpa_rev = match get("IWARP_MPA_REV").as_deref() {
            None | Some("" | "2") => 2,
            Some("1") => 1,
            Some(other) => return Err(format!("IWARP_MPA_REV={other}: expected 1 or 2")),
        };
        let transport = match get("IWARP_TRANSPORT").as_deref() {
            None | Some("" | "kernel") => {
                for v in ["IWARP_TAP", "IWARP_IFACE", "IWARP_IP", "IWARP_MAC", "IWARP_GATEWAY"] {
                    if get(v).is_some_and(|s| !s.is_empty()) {
                        return Err(format!("{v} needs IWARP_TRANSPORT=smoltcp"));
                    }
                }
                TransportConfig::Kernel
            }
            Some("smoltcp") => {
                let dev = match (get("IWARP_TAP"), get("IWARP_IFACE")) {
                    (Some(t), None) if !t.is_empty() => SmolDevice::Tap(t),
                    (None, Some(i)) if !i.is_empty() => SmolDevice::Raw(i),
                    _ => return Err("IWARP_TRANSPORT=smoltcp needs one of IWARP_TAP or IWARP_IFACE".into()),
                };
                let ip = get("IWARP_IP").ok_or("IWARP_TRANSPORT=smoltcp needs IWARP_IP=ADDR/PREFIX")?;
                let (addr, prefix) = ip
                    .split_once('/')
                    .and_then(|(a, p)| Some((a.parse::<Ipv4Addr>().ok()?, p.parse::<u8>().ok()?)))
                    .filter(|&(_, p)| p <= 32)
                    .ok_or_else(|| format!("IWARP_IP={ip}: expected an IPv4 ADDR/PREFIX"))?;
                let mut config = SmolConfig::new(addr, prefix);
                if let Some(mac) = get("IWARP_MAC").filter(|s| !s.is_empty()) {
                    config.mac =
                        Some(parse_mac(&mac).ok_or_else(|| format!("IWARP_MAC={mac}: not a station MAC"))?);
                }
                if let Some(gw) = get("IWARP_GATEWAY").filter(|s| !s.is_empty()) {
                    config.gateway =
                        Some(gw.parse().map_err(|_| format!("IWARP_GATEWAY={gw}: not an IPv4 address"))?);
                }
                TransportConfig::Smol(dev, config)
            }
            Some(other) => return Err(format!("IWARP_TRANSPORT={other}: expected kernel or smoltcp")),
        };
        let device_name = get("IWARP_DEVICE").filter(|s| !s.is_empty()).unwrap_or_else(|| "iwarp0".into());
        if device_name.len() >= 64 || !device_name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("IWARP_DEVICE={device_name}: at most 63 printable characters"));
        }
        let connect_retry = match get("IWARP_CONNECT_RETRY_MS").filter(|s| !s.is_empty()) {
            None => std::time::Duration::from_millis(1000),
            Some(ms) => ms
                .parse::<u64>()
                .ok()
                .filter(|&ms| ms <= 60_000)
                .map(std::time::Duration::from_millis)
                .ok_or_else(|| format!("IWARP_CONNECT_RETRY_MS={ms}: expected milliseconds, 0 to 60000"))?,
        };
        let poll_idle = match get("IWARP_POLL_IDLE_US").filter(|s| !s.is_empty()) {
            None => Some(std::time::Duration::from_micros(200)),
            Some(us) => match us.parse::<u64>().ok().filter(|&us| us <= 1_000_000) {
                Some(0) => None,
                Some(us) => Some(std::time::Duration::from_micros(us)),
                None => {
                    return Err(format!("IWARP_POLL_IDLE_US={us}: expected microseconds, 0 to 1000000"));
                }
            },
        };
        Ok(Config {
            device_name,
            connect_retry,
            poll_idle,
            poll_mode,
            transport,
            crc,
            mpa_rev,
            markers: flag("IWARP_MARKERS", get("IWARP_MARKERS"))?,
            p2p: flag("IWARP_P2P", get("IWARP_P2P"))?,
            pcap: get("IWARP_PCAP").filter(|s| !s.is_empty()).map(PathBuf::from),
            log: get("IWARP_LOG").filter(|s| !s.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, String> {
        Config::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.device_name, "iwarp0");
        assert_eq!(c.poll_mode, PollMode::Adaptive);
        assert!(matches!(c.transport, TransportConfig::Kernel));
        assert_eq!((c.crc, c.mpa_rev, c.markers, c.p2p), (CrcPolicy::Off, 2, false, false));
        assert_eq!(c.connect_retry, std::time::Duration::from_secs(1));
        assert_eq!(cfg(&[("IWARP_CONNECT_RETRY_MS", "0")]).unwrap().connect_retry, std::time::Duration::ZERO);
        assert_eq!(c.poll_idle, Some(std::time::Duration::from_micros(200)));
        assert_eq!(cfg(&[("IWARP_POLL_IDLE_US", "0")]).unwrap().poll_idle, None);
        assert_eq!(
            cfg(&[("IWARP_POLL_IDLE_US", "1500")]).unwrap().poll_idle,
            Some(std::time::Duration::from_micros(1500))
        );
    }

    #[test]
    fn settings_and_errors() {
        let c = cfg(&[("IWARP_CRC", "required"), ("IWARP_MPA_REV", "1"), ("IWARP_POLL", "busy")]).unwrap();
        assert_eq!((c.crc, c.mpa_rev, c.poll_mode), (CrcPolicy::Required, 1, PollMode::Busy));
        let c = cfg(&[("IWARP_TRANSPORT", "smoltcp"), ("IWARP_TAP", "tap0"), ("IWARP_IP", "10.0.0.1/24")])
            .unwrap();
        match c.transport {
            TransportConfig::Smol(SmolDevice::Tap(t), s) => {
                assert_eq!((t.as_str(), s.ip, s.prefix_len), ("tap0", Ipv4Addr::new(10, 0, 0, 1), 24));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            vec![("IWARP_CRC", "maybe")],
            vec![("IWARP_MPA_REV", "3")],
            vec![("IWARP_TAP", "tap0")],
            vec![("IWARP_TRANSPORT", "smoltcp"), ("IWARP_TAP", "t")],
            vec![("IWARP_TRANSPORT", "smoltcp"), ("IWARP_TAP", "t"), ("IWARP_IP", "10.0.0.1")],
            vec![("IWARP_P2P", "2")],
            vec![("IWARP_DEVICE", "has space")],
            vec![("IWARP_CONNECT_RETRY_MS", "soon")],
            vec![("IWARP_POLL_IDLE_US", "-1")],
            vec![("IWARP_POLL_IDLE_US", "2000000")],
        ] {
            let e = cfg(&bad).unwrap_err();
            assert!(e.contains(bad[bad.len() - 1].0) || e.contains(bad[0].0), "{e}");
        }
    }
}
