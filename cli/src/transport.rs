//! The `--transport` flags shared by rping, perftest and bench: the kernel's TCP, or smoltcp
//! (userspace TCP/IP) on a TAP device or a raw Ethernet interface.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use iwarp::netdev::{Offload, SmolConfig, SmolStack};
use iwarp::{CmError, Device, ListenOptions, Listener, Transport};

/// Which TCP/IP runs under MPA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// The kernel's TCP sockets.
    Kernel,
    /// smoltcp, this process's own TCP/IP, on --tap or --iface.
    Smoltcp,
}

/// Whether a smoltcp stack asks its device for offloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OffloadArg {
    /// Segmentation (64 KiB TCP segments cut by the kernel or the NIC), receive coalescing
    /// and checksum offload, as far as the device offers them.
    Auto,
    /// None: smoltcp sends wire-sized segments and computes and checks every checksum.
    Off,
}

/// The transport flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TransportArgs {
    /// The TCP/IP under MPA: the kernel's, or smoltcp (userspace TCP/IP) on a TAP device
    /// (--tap) or a raw Ethernet interface (--iface), with its own address (--ip).
    #[arg(long, value_enum, default_value_t = Kind::Kernel)]
    pub(crate) transport: Kind,
    /// smoltcp: the TAP device to use (it must exist: `ip tuntap add mode tap NAME`).
    #[arg(long, value_name = "NAME", conflicts_with = "iface")]
    pub(crate) tap: Option<String>,
    /// smoltcp: the raw Ethernet interface to use (e.g. one end of a veth pair; its kernel
    /// side should have no IP address).
    #[arg(long, value_name = "NAME")]
    pub(crate) iface: Option<String>,
    /// smoltcp: the stack's IPv4 address and prefix length, e.g. 10.0.0.1/24.
    #[arg(long, value_name = "ADDR/PREFIX", value_parser = parse_cidr)]
    pub(crate) ip: Option<(Ipv4Addr, u8)>,
    /// smoltcp: the stack's MAC address (default: a random locally administered one).
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    pub(crate) mac: Option<[u8; 6]>,
    /// smoltcp: the default gateway.
    #[arg(long, value_name = "ADDR")]
    pub(crate) gateway: Option<Ipv4Addr>,
    /// smoltcp: segmentation and checksum offload through the device's virtio-net header
    /// (default auto: what the device offers).
    #[arg(long, value_enum, value_name = "auto|off")]
    pub(crate) offload: Option<OffloadArg>,
}

/// Parses `ADDR/PREFIX` (IPv4).
pub(crate) fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, prefix) =
        s.split_once('/').ok_or_else(|| format!("'{s}' is not ADDR/PREFIX (e.g. 10.0.0.1/24)"))?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| format!("'{addr}' is not an IPv4 address"))?;
    let prefix: u8 = prefix.parse().map_err(|_| format!("'{prefix}' is not a prefix length"))?;
    if prefix > 32 {
        return Err(format!("prefix length {prefix} is over 32"));
    }
    Ok((addr, prefix))
}

/// Parses a MAC address `aa:bb:cc:dd:ee:ff`.
pub(crate) fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return Err(format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16)
            .map_err(|_| format!("'{s}' is not a MAC address (aa:bb:cc:dd:ee:ff)"))?;
    }
    if mac[0] & 1 != 0 {
        return Err(format!("{s} is a multicast address, not a station's"));
    }
    Ok(mac)
}

/// Which device a stack opens.
#[derive(Debug, Clone)]
pub(crate) enum Dev {
    /// A TAP device.
    Tap(String),
    /// A raw Ethernet interface.
    Raw(String),
}

impl TransportArgs {
    /// Whether smoltcp was asked for.
    pub(crate) fn smoltcp(&self) -> bool {
        self.transport == Kind::Smoltcp
    }

    /// Checks the flag combination (a usage error otherwise): the device and address with
    /// smoltcp, none of the smoltcp flags without it.
    pub(crate) fn check(&self) -> Result<Option<(Dev, SmolConfig)>, String> {
        if !self.smoltcp() {
            let stray = [
                ("--tap", self.tap.is_some()),
                ("--iface", self.iface.is_some()),
                ("--ip", self.ip.is_some()),
                ("--mac", self.mac.is_some()),
                ("--gateway", self.gateway.is_some()),
                ("--offload", self.offload.is_some()),
            ];
            if let Some((flag, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(format!("{flag} needs --transport smoltcp"));
            }
            return Ok(None);
        }
        let dev = match (&self.tap, &self.iface) {
            (Some(tap), None) => Dev::Tap(tap.clone()),
            (None, Some(iface)) => Dev::Raw(iface.clone()),
            _ => return Err("--transport smoltcp needs --tap NAME or --iface NAME".into()),
        };
        let Some((ip, prefix)) = self.ip else {
            return Err("--transport smoltcp needs --ip ADDR/PREFIX (the stack's own address)".into());
        };
        let mut config = SmolConfig::new(ip, prefix);
        config.mac = self.mac;
        config.gateway = self.gateway;
        config.offload = match self.offload {
            Some(OffloadArg::Off) => Offload::Off,
            Some(OffloadArg::Auto) | None => Offload::Auto,
        };
        Ok(Some((dev, config)))
    }
}

/// Opens a smoltcp stack; the error is one line naming the device.
pub(crate) fn open_stack(dev: &Dev, config: SmolConfig) -> Result<SmolStack, String> {
    let result = match dev {
        Dev::Tap(name) => SmolStack::tap(name, config),
        Dev::Raw(name) => SmolStack::raw(name, config),
    };
    result.map_err(|e| {
        let (what, name) = match dev {
            Dev::Tap(n) => ("TAP device", n),
            Dev::Raw(n) => ("interface", n),
        };
        let hint = match e.kind() {
            std::io::ErrorKind::PermissionDenied => " (needs root or CAP_NET_ADMIN/CAP_NET_RAW)",
            _ => "",
        };
        format!("cannot open {what} {name}: {e}{hint}")
    })
}

/// Records the stack's real frames into `path` (smoltcp's `--pcap`).
pub(crate) fn capture(stack: &SmolStack, path: &Path) -> Result<(), String> {
    stack.capture(path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// The transport value for a stack (smoltcp) or none (the kernel's TCP).
pub(crate) fn transport(stack: Option<&SmolStack>) -> Transport {
    stack.map_or(Transport::Kernel, |s| Transport::Smol(s.clone()))
}

/// Listen options on the kernel's TCP or `stack` (smoltcp), the defaults otherwise.
pub(crate) fn listen_options(stack: Option<&SmolStack>) -> ListenOptions {
    ListenOptions { transport: transport(stack), ..ListenOptions::default() }
}

/// Listens on `bind` (kernel) or on `bind`'s port of `stack` (smoltcp).
pub(crate) fn listen(
    device: &Device,
    stack: Option<&SmolStack>,
    bind: SocketAddr,
) -> Result<Listener, CmError> {
    device.listen_with(bind, &listen_options(stack))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_and_mac() {
        assert_eq!(parse_cidr("10.1.2.3/24"), Ok((Ipv4Addr::new(10, 1, 2, 3), 24)));
        assert!(parse_cidr("10.1.2.3").is_err());
        assert!(parse_cidr("10.1.2.3/33").is_err());
        assert_eq!(parse_mac("02:00:00:00:00:01"), Ok([2, 0, 0, 0, 0, 1]));
        assert!(parse_mac("01:00:00:00:00:01").is_err());
        assert!(parse_mac("02:00:00").is_err());
    }
}
