//! The [`Link`] trait every transport implements, and [`LinkError`].

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

/// Why a link cannot carry bytes (any more).
///
/// "Nothing to do right now" is never an error: [`Link::recv`] and [`Link::send_vectored`]
/// return `Ok(0)` for it.
#[derive(Debug)]
#[non_exhaustive]
pub enum LinkError {
    /// The peer closed its sending direction in order (TCP FIN after all its bytes): every byte
    /// it sent has been received. Returned by [`Link::recv`].
    Closed,
    /// The connection was reset or aborted (TCP RST, broken pipe, a cut in-memory link): bytes
    /// in flight may be lost.
    Reset,
    /// [`Link::send_vectored`] after this end called [`Link::shutdown_write`] (local API misuse).
    WriteShutdown,
    /// Another I/O error from the operating system.
    Io(io::Error),
}

impl LinkError {
    /// Maps an I/O error to a link error: reset-like kinds become [`LinkError::Reset`].
    pub fn from_io(err: io::Error) -> Self {
        match err.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected => LinkError::Reset,
            _ => LinkError::Io(err),
        }
    }
}

impl From<io::Error> for LinkError {
    fn from(err: io::Error) -> Self {
        LinkError::from_io(err)
    }
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Closed => f.write_str("link closed by the peer"),
            LinkError::Reset => f.write_str("link reset"),
            LinkError::WriteShutdown => f.write_str("send on a link whose sending side was shut down"),
            LinkError::Io(err) => write!(f, "link I/O error: {err}"),
        }
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LinkError::Io(err) => Some(err),
            _ => None,
        }
    }
}

/// A reliable, ordered, full-duplex byte stream that never blocks.
///
/// Object safe and `Send`, so an engine thread can own a `Vec<Box<dyn Link>>` of mixed
/// transports. Readiness: a link with a descriptor ([`Link::fd`]) is registered for
/// edge-triggered readiness, so after an event the engine calls `recv` until it returns
/// `Ok(0)` (or an error, or a short read) and `send_vectored` until it accepts less than
/// offered, before it waits again; a link without one is polled.
pub trait Link: Send {
    /// Reads received bytes into `buf`. `Ok(0)` means nothing is available now (or `buf` is
    /// empty); it never blocks. `Err(LinkError::Closed)` once the peer's orderly close has been
    /// reached (after every byte it sent), and on every later call.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError>;

    /// Reads received bytes into `bufs`, filling each before the next (as `readv(2)` does);
    /// otherwise as [`Link::recv`]. The default reads into one buffer after another while
    /// each comes back full.
    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, LinkError> {
        let mut total = 0;
        for buf in bufs.iter_mut().filter(|b| !b.is_empty()) {
            let n = match self.recv(buf) {
                Ok(n) => n,
                // What was read already is reported first; the error comes again next call.
                Err(_) if total > 0 => return Ok(total),
                Err(e) => return Err(e),
            };
            total += n;
            if n < buf.len() {
                break;
            }
        }
        Ok(total)
    }

    /// Hands as many bytes of `bufs` (in order) to the transport as it accepts without blocking
    /// and returns how many; `Ok(0)` means no room now. The bytes accepted are sent in order
    /// after those of earlier calls; the caller keeps the rest and offers it again later.
    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError>;

    /// [`Link::send_vectored`] with one buffer.
    fn send(&mut self, buf: &[u8]) -> Result<usize, LinkError> {
        self.send_vectored(&[IoSlice::new(buf)])
    }

    /// Closes the sending direction in order: the peer receives every byte accepted so far and
    /// then sees [`LinkError::Closed`]. Receiving continues. Idempotent.
    fn shutdown_write(&mut self);

    /// The local address, where the transport has one.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The peer's address, where the transport has one.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// The descriptor whose readiness (readable, writable, hung up) follows the link's, for an
    /// engine's readiness poll, or `None` when the transport has none to wait on (the engine
    /// then polls the link).
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

impl<L: Link + ?Sized> Link for Box<L> {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        (**self).recv(buf)
    }

    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, LinkError> {
        (**self).recv_vectored(bufs)
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError> {
        (**self).send_vectored(bufs)
    }

    fn send(&mut self, buf: &[u8]) -> Result<usize, LinkError> {
        (**self).send(buf)
    }

    fn shutdown_write(&mut self) {
        (**self).shutdown_write();
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        (**self).local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        (**self).peer_addr()
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_is_object_safe_and_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Box<dyn Link>>();
    }

    #[test]
    fn io_errors_map_to_reset_or_io() {
        assert!(matches!(LinkError::from(io::Error::from(io::ErrorKind::ConnectionReset)), LinkError::Reset));
        assert!(matches!(LinkError::from(io::Error::from(io::ErrorKind::BrokenPipe)), LinkError::Reset));
        assert!(matches!(
            LinkError::from(io::Error::from(io::ErrorKind::PermissionDenied)),
            LinkError::Io(_)
        ));
        assert_eq!(LinkError::Closed.to_string(), "link closed by the peer");
    }
}
