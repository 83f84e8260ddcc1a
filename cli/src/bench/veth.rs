//! The kernel-TCP baseline over the same veth pair as the smoltcp stacks: each end of the pair
//! in its own network namespace (`ip netns add`), the stacks and the kernel's sockets made from
//! threads that entered the namespace of their end.

use std::net::Ipv4Addr;
use std::os::fd::AsFd as _;

use super::results::BenchError;

/// A named network namespace (`/run/netns/NAME`, as `ip netns add` makes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    /// Runs `f` on a thread of its own that entered the namespace, and returns its result.
    /// Sockets made there stay in the namespace, whichever thread uses them later.
    pub(crate) fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, BenchError> {
        let path = format!("/run/netns/{}", self.0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).map_err(|e| {
                    BenchError(format!("network namespace {}: cannot open {path}: {e}", self.0))
                })?;
                rustix::thread::move_into_link_name_space(
                    file.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .map_err(|e| {
                    BenchError(format!("cannot enter network namespace {}: {e} (needs root)", self.0))
                })?;
                Ok(f())
            })
            .join()
            .map_err(|_| BenchError(format!("a thread in network namespace {} panicked", self.0)))?
        })
    }
}

/// Where the kernel-TCP baseline runs: the two ends of the veth pair, each in its namespace;
/// the server listens on the kernel's address of its end.
#[derive(Debug, Clone)]
pub(crate) struct VethPath {
    pub(crate) client: Netns,
    pub(crate) server: Netns,
    pub(crate) server_ip: Ipv4Addr,
}

impl VethPath {
    /// The path between `client` and `server`, with the kernel's IPv4 address of
    /// `server_iface` (an error when it has none).
    pub(crate) fn new(client: Netns, server: Netns, server_iface: &str) -> Result<VethPath, BenchError> {
        let ip = server
            .run(|| iwarp::netdev::interface_ipv4(server_iface))?
            .map_err(|e| BenchError(format!("addresses of {server_iface} in {}: {e}", server.0)))?;
        let server_ip = ip.ok_or_else(|| {
            BenchError(format!(
                "the kernel-TCP baseline over the veth pair needs an IPv4 address on {server_iface} in \
                 namespace {} (ip -n {} addr add ADDR/P dev {server_iface})",
                server.0, server.0
            ))
        })?;
        Ok(VethPath { client, server, server_ip })
    }
}
