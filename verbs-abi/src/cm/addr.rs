//! Socket addresses between C and Rust, the local address a route to a peer would use, and
//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`.

use std::ffi::{CStr, c_char, c_int};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs, UdpSocket};

use crate::ffi::{Result, minus1_call};
use crate::sys::*;

/// The address families as `sa_family_t`, and the two address lengths.
#[expect(clippy::cast_possible_truncation, reason = "small constants: 2, 10, 16, 28")]
const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const AF_INET6: libc::sa_family_t = libc::AF_INET6 as libc::sa_family_t;

#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const SOCKADDR_IN_LEN: socklen_t = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const SOCKADDR_IN6_LEN: socklen_t = std::mem::size_of::<libc::sockaddr_in6>() as socklen_t;

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

fn c_string(p: *const c_char) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(|s| Some(s.to_string())).map_err(|_| libc::EINVAL)
}

/// Resolves `node` and `service` into a one-entry `rdma_addrinfo` list for
/// [`iwarp_rdma_freeaddrinfo`]: with `RAI_PASSIVE` a source address to bind (any address
/// when `node` is NULL), otherwise a destination. Numeric ports only.
///
/// # Safety
///
/// `node` and `service` are NULL or NUL-terminated strings; `hints` NULL or a readable
/// `rdma_addrinfo`; `res` a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn iwarp_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    minus1_call("rdma_getaddrinfo", || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(libc::EINVAL);
        }
        let node = c_string(node)?;
        let port = match c_string(service)? {
            Some(s) => s.parse::<u16>().map_err(|_| libc::EINVAL)?,
            None => 0,
        };
        // SAFETY: the caller passes a readable structure or NULL.
        let hints = if hints.is_null() { None } else { Some(unsafe { *hints }) };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let family = hints.map_or(0, |h| h.ai_family);
        let passive = flags & RAI_PASSIVE as c_int != 0;
        let addr = match node {
            None if passive => {
                if family == libc::AF_INET6 {
                    SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
                } else {
                    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
                }
            }
            None => return Err(libc::EINVAL),
            Some(host) => (host.as_str(), port)
                .to_socket_addrs()
                .map_err(|_| libc::EADDRNOTAVAIL)?
                .find(|a| match family {
                    libc::AF_INET => a.is_ipv4(),
                    libc::AF_INET6 => a.is_ipv6(),
                    _ => true,
                })
                .ok_or(libc::EADDRNOTAVAIL)?,
        };
        let len: socklen_t = if addr.is_ipv4() { SOCKADDR_IN_LEN } else { SOCKADDR_IN6_LEN };
        // SAFETY: calloc of one entry and one address; checked for NULL below.
        let ai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
        // SAFETY: as above.
        let sa = unsafe { libc::calloc(1, std::mem::size_of::<sockaddr_storage>()) }.cast::<u8>();
        if ai.is_null() || sa.is_null() {
            // SAFETY: either came from calloc or is NULL.
            unsafe {
                libc::free(ai.cast());
                libc::free(sa.cast());
            }
            return Err(libc::ENOMEM);
        }
        write(sa, addr);
        let qp_type = hints.map_or(0, |h| h.ai_qp_type);
        let ps = hints.map_or(0, |h| h.ai_port_space);
        // SAFETY: `ai` is a fresh zeroed entry (checked non-null).
        let e = unsafe { &mut *ai };
        e.ai_flags = flags;
        e.ai_family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        e.ai_qp_type = if qp_type == 0 { IBV_QPT_RC as c_int } else { qp_type };
        e.ai_port_space = if ps == 0 { RDMA_PS_TCP as c_int } else { ps };
        if passive {
            e.ai_src_addr = sa.cast();
            e.ai_src_len = len;
        } else {
            e.ai_dst_addr = sa.cast();
            e.ai_dst_len = len;
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
