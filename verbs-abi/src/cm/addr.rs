//! Socket addresses between C and Rust, the local address a route to a peer would use, and
//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`.

use std::ffi::{c_char, c_int};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};

use crate::ffi::{Result, minus1_call};
use crate::sys::*;

/// The address families as `sa_family_t`.
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const AF_INET6: libc::sa_family_t = libc::AF_INET6 as libc::sa_family_t;

/// `AF_IB`, InfiniBand's native addresses (not offered: the device is iWARP).
const AF_IB: c_int = 27;

/// The socket address at `p` (a `sockaddr_in` or `sockaddr_in6`).
pub(super) fn read(p: *const sockaddr) -> Result<SocketAddr> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a socket address; its family field comes first.
    let family = unsafe { p.cast::<libc::sa_family_t>().read_unaligned() };
    match c_int::from(family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let a = unsafe { p.cast::<libc::sockaddr_in>().read_unaligned() };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let a = unsafe { p.cast::<libc::sockaddr_in6>().read_unaligned() };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Writes `a` at `p`, which has room for a `sockaddr_storage`.
pub(super) fn write(p: *mut u8, a: SocketAddr) {
    // SAFETY: the caller's storage has room for a sockaddr_storage (128 bytes), larger than
    // either address; unaligned writes.
    unsafe {
        std::ptr::write_bytes(p, 0, std::mem::size_of::<sockaddr_storage>());
        match a {
            SocketAddr::V4(v4) => {
                let mut s: libc::sockaddr_in = std::mem::zeroed();
                s.sin_family = AF_INET;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                p.cast::<libc::sockaddr_in>().write_unaligned(s);
            }
            SocketAddr::V6(v6) => {
                let mut s: libc::sockaddr_in6 = std::mem::zeroed();
                s.sin6_family = AF_INET6;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_flowinfo = v6.flowinfo();
                s.sin6_scope_id = v6.scope_id();
                p.cast::<libc::sockaddr_in6>().write_unaligned(s);
            }
        }
    }
}

/// The local address a connection to `dst` would come from: the smoltcp stack's own, or the
/// kernel's choice (a UDP socket "connected" to `dst`: no packet is sent).
pub(super) fn source_for(dst: SocketAddr, smol: Option<Ipv4Addr>) -> SocketAddr {
    if let Some(ip) = smol {
        return SocketAddr::from((ip, 0));
    }
    let any: SocketAddr =
        if dst.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    UdpSocket::bind(any)
        .and_then(|s| s.connect(dst).and_then(|()| s.local_addr()))
        .map(|mut a| {
            a.set_port(0);
            a
        })
        .unwrap_or(any)
}

/// A copy of the socket address at `src` (`len` bytes) in fresh `malloc`ed memory, which
/// [`iwarp_rdma_freeaddrinfo`] frees.
fn copy_addr(src: *const sockaddr, len: socklen_t) -> Result<*mut sockaddr> {
    let n = usize::try_from(len).map_err(|_| libc::EINVAL)?;
    if src.is_null() || n == 0 || n > std::mem::size_of::<sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: malloc of `n` bytes, checked for NULL.
    let dst = unsafe { libc::malloc(n) }.cast::<u8>();
    if dst.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: the caller's address has `len` readable bytes; `dst` has `n` writable ones.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst, n) };
    Ok(dst.cast())
}

/// `getaddrinfo(3)` hints for `rdma_getaddrinfo`'s: passive and numeric-host flags, the
/// family, the socket type of the QP type and the protocol of the port space.
fn ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: addrinfo is plain data; all zero is "no hints".
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE as c_int != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST as c_int != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family == libc::AF_INET || h.ai_family == libc::AF_INET6 {
        ai.ai_family = h.ai_family;
    }
    let qp = u32::try_from(h.ai_qp_type).unwrap_or(u32::MAX);
    if qp == IBV_QPT_RC || qp == IBV_QPT_UC || qp == IBV_QPT_XRC_SEND || qp == IBV_QPT_XRC_RECV {
        ai.ai_socktype = libc::SOCK_STREAM;
    } else if qp == IBV_QPT_UD {
        ai.ai_socktype = libc::SOCK_DGRAM;
    }
    let ps = u32::try_from(h.ai_port_space).unwrap_or(u32::MAX);
    if ps == RDMA_PS_TCP || (ps == RDMA_PS_IB && ai.ai_socktype == libc::SOCK_STREAM) {
        ai.ai_protocol = libc::IPPROTO_TCP;
    } else if ps == RDMA_PS_UDP
        || ps == RDMA_PS_IPOIB
        || (ps == RDMA_PS_IB && ai.ai_socktype == libc::SOCK_DGRAM)
    {
        ai.ai_protocol = libc::IPPROTO_UDP;
    }
    ai
}

/// The `getaddrinfo(3)` error `code` as an errno value.
fn gai_errno(code: c_int) -> c_int {
    match code {
        libc::EAI_MEMORY => libc::ENOMEM,
        libc::EAI_FAMILY => libc::EAFNOSUPPORT,
        libc::EAI_SYSTEM => std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
        libc::EAI_BADFLAGS | libc::EAI_SERVICE | libc::EAI_SOCKTYPE => libc::EINVAL,
        _ => libc::EADDRNOTAVAIL,
    }
}

/// A field of the answer: the hint's value when it gives one, else what `pairs` maps the
/// resolved `got` to (0 when none does).
fn hinted(hint: c_int, got: c_int, pairs: &[(c_int, c_int)]) -> c_int {
    if hint != 0 {
        return hint;
    }
    pairs.iter().find(|&&(from, _)| from == got).map_or(0, |&(_, to)| to)
}

/// Fills `e` from the first answer of `getaddrinfo(node, service)` with `h`'s hints, as
/// rdma-core does: the address is the source of a passive entry, the destination otherwise;
/// the QP type and port space are the hints' or those of the socket type and protocol.
fn resolve_into(
    e: &mut rdma_addrinfo,
    node: *const c_char,
    service: *const c_char,
    h: Option<&rdma_addrinfo>,
) -> Result<()> {
    let hints = h.map(ai_hints);
    let mut list: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: node and service are NULL or NUL-terminated (the caller's contract); the hints
    // are a local structure; `list` receives a list freed below.
    let rc = unsafe {
        libc::getaddrinfo(
            node,
            service,
            hints.as_ref().map_or(std::ptr::null(), std::ptr::from_ref),
            &raw mut list,
        )
    };
    if rc != 0 {
        return Err(gai_errno(rc));
    }
    let out = (|| {
        // SAFETY: getaddrinfo succeeded, so `list` is a non-empty list it allocated.
        let ai = unsafe { &*list };
        if ai.ai_family != libc::AF_INET && ai.ai_family != libc::AF_INET6 {
            return Err(libc::EAFNOSUPPORT);
        }
        e.ai_qp_type = hinted(
            h.map_or(0, |h| h.ai_qp_type),
            ai.ai_socktype,
            &[(libc::SOCK_STREAM, IBV_QPT_RC as c_int), (libc::SOCK_DGRAM, IBV_QPT_UD as c_int)],
        );
        e.ai_port_space = hinted(
            h.map_or(0, |h| h.ai_port_space),
            ai.ai_protocol,
            &[(libc::IPPROTO_TCP, RDMA_PS_TCP as c_int), (libc::IPPROTO_UDP, RDMA_PS_UDP as c_int)],
        );
        e.ai_family = ai.ai_family;
        let addr = copy_addr(ai.ai_addr.cast(), ai.ai_addrlen)?;
        if ai.ai_flags & libc::AI_PASSIVE != 0 {
            e.ai_flags = RAI_PASSIVE as c_int;
            e.ai_src_addr = addr;
            e.ai_src_len = ai.ai_addrlen;
        } else {
            e.ai_dst_addr = addr;
            e.ai_dst_len = ai.ai_addrlen;
        }
        Ok(())
    })();
    // SAFETY: the list getaddrinfo returned, freed once.
    unsafe { libc::freeaddrinfo(list) };
    out
}

/// `rdma_getaddrinfo`, as rdma-core's for IP addresses: with `node` or `service`, the first
/// answer of `getaddrinfo(3)` under the hints (`RAI_PASSIVE`: a source address to bind, the
/// wildcard when `node` is NULL; otherwise a destination); with neither, the hints' flags,
/// family, QP type, port space and destination address. A source address in the hints is
/// then copied when the entry has none. One entry; free it with [`iwarp_rdma_freeaddrinfo`].
/// A name that does not resolve is `EADDRNOTAVAIL`; `AF_IB` is `EAFNOSUPPORT`.
///
/// # Safety
///
/// `node` and `service` are NULL or NUL-terminated strings; `hints` NULL or a readable
/// `rdma_addrinfo` whose addresses are readable for their lengths; `res` a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iwarp_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    minus1_call("rdma_getaddrinfo", || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable structure or NULL.
        let h = if hints.is_null() { None } else { Some(unsafe { *hints }) };
        if h.is_some_and(|h| h.ai_family == AF_IB) {
            return Err(libc::EAFNOSUPPORT);
        }
        // SAFETY: calloc of one entry, checked for NULL.
        let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        if ai.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: a fresh zeroed entry (checked non-null), owned here until returned.
        let e = unsafe { &mut *ai };
        let filled = (|| {
            if !node.is_null() || !service.is_null() {
                resolve_into(e, node, service, h.as_ref())?;
            } else if let Some(h) = h {
                e.ai_flags = h.ai_flags;
                e.ai_family = h.ai_family;
                e.ai_qp_type = h.ai_qp_type;
                e.ai_port_space = h.ai_port_space;
                if h.ai_dst_len != 0 {
                    e.ai_dst_addr = copy_addr(h.ai_dst_addr, h.ai_dst_len)?;
                    e.ai_dst_len = h.ai_dst_len;
                }
            }
            if let Some(h) = h
                && e.ai_src_len == 0
                && h.ai_src_len != 0
            {
                e.ai_src_addr = copy_addr(h.ai_src_addr, h.ai_src_len)?;
                e.ai_src_len = h.ai_src_len;
            }
            Ok(())
        })();
        if let Err(errno) = filled {
            // SAFETY: the entry and whatever addresses it holds came from this function.
            unsafe { iwarp_rdma_freeaddrinfo(ai) };
            return Err(errno);
        }
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *res = ai };
        Ok(0)
    })
}

/// Frees a list from [`iwarp_rdma_getaddrinfo`].
///
/// # Safety
///
/// `res` came from [`iwarp_rdma_getaddrinfo`] (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iwarp_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: every entry and its addresses came from calloc in rdma_getaddrinfo.
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free(cur.cast());
            cur = next;
        }
    }
}

symver!("IWARP_PRIVATE_1": iwarp_rdma_getaddrinfo, iwarp_rdma_freeaddrinfo);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for a in ["10.1.2.3:7174", "[fe80::1]:18515", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            let mut storage = [0u8; 128];
            write(storage.as_mut_ptr(), a);
            assert_eq!(read(storage.as_ptr().cast()).unwrap(), a);
        }
        let storage = [0u8; 128];
        assert_eq!(read(storage.as_ptr().cast()), Err(libc::EAFNOSUPPORT));
        assert_eq!(read(std::ptr::null()), Err(libc::EINVAL));
    }

    #[test]
    fn source_of_loopback() {
        let s = source_for("127.0.0.1:1".parse().unwrap(), None);
        assert!(s.ip().is_loopback(), "{s}");
        let s = source_for("127.0.0.1:1".parse().unwrap(), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(s, "10.0.0.2:0".parse().unwrap());
    }
}
