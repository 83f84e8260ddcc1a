//! rsockets: librdmacm's socket API (`rsocket`, `rconnect`, `rsend`, `rpoll`, ...), stream
//! sockets only, wire-compatible with rdma-core 44's rsockets over iWARP. Built on this
//! library's own rdma_cm and verbs: each connected rsocket is a synchronous rdma_cm id with
//! a reliable connected queue pair and one completion queue.
//!
//! The protocol (docs/upper-layers.md, "rsockets", has the wire layout): each end registers
//! a receive ring and a two-entry target list and tells the peer about both in the
//! connection private data ([`wire::ConnData`]). Data goes as an RDMA Write into the ring
//! region the peer granted, followed by a 4-byte Send carrying the message word (iWARP has
//! no immediate data); the receiver grants the next half of its ring by writing a
//! descriptor into the sender's target list and sending an `OP_SGL` word with the new
//! credit limit. Control words close one or both directions.
//!
//! The descriptor each call takes is a real descriptor of this library's (an eventfd that
//! nothing signals): it never collides with the program's own descriptors, so `rpoll` and
//! `rselect` can take both kinds in one set. Datagram rsockets (`SOCK_DGRAM`) are refused
//! with `ENOTSUP`; `riomap`/`riowrite` (direct placement) with `ENOSYS`.

pub mod wire;

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_int, c_long, c_void};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::cm::{
    rdma_accept, rdma_bind_addr, rdma_connect, rdma_create_id, rdma_create_qp, rdma_destroy_id,
    rdma_destroy_qp, rdma_disconnect, rdma_get_local_addr, rdma_get_peer_addr, rdma_listen, rdma_reject,
    rdma_resolve_addr, rdma_resolve_route, rdma_set_option, sync_reply, take_request,
};
use crate::context::MAX_QP_WR;
use crate::cq::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq,
    ibv_get_cq_event,
};
use crate::ffi::{Result, ZeroedC, minus1_call, set_errno, zeroed};
use crate::sys::*;
use crate::verbs::{ibv_dereg_mr, ibv_reg_mr};
use wire::*;

/// `SOL_RDMA` (rdma/rsocket.h) and its options.
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

/// Defaults (rdma-core's, without its configuration files).
const DEF_SQSIZE: u32 = 384;
const DEF_RQSIZE: u32 = 384;
const DEF_INLINE: u32 = 64;
const DEF_MEM: u32 = 1 << 17;
/// The largest send or receive ring.
const MAX_RING: u32 = 64 << 20;
/// Queue sizes are kept within these.
const QP_MIN_SIZE: u32 = 16;
const QP_MAX_SIZE: u32 = 0xFFFE;
/// A send waits until this much of the send ring is free.
const SNDLOWAT: usize = 2048;
/// Transfers start at this size and double up to `MAX_TRANSFER` within one `rsend`.
const OLAP_START: usize = 2048;
const MAX_TRANSFER: usize = 65536;
/// Receives posted beyond the credits granted. The credits bound the peer's data messages
/// not yet consumed, but its control messages (credit updates, shutdown) take receives too:
/// a peer that sends its full credit of data right after a credit update would find the
/// receive queue empty (a DDP "no buffer" Terminate) if this end had not polled in between,
/// as happened on a loaded machine.
const RECV_SPARE: u32 = 64;
/// Control messages (credit updates, shutdown) in flight at most.
const CTRL_SLOTS: u32 = 4;
/// The work request id bit of receives, and of the message Send that follows a Write.
const WR_RECV: u64 = 1 << 63;
const WR_MSG_SEND: u64 = 1 << 62;
/// How long a blocked call sleeps at most before it looks at its queue again.
const NAP_MS: c_int = 100;
/// How long `rclose` waits for the peer to take the disconnect message.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long `rclose` then waits for the peer to close the connection itself (unless the
/// peer disconnected first: then it reads nothing more). Closing the
/// TCP connection first, while the peer still sends credit updates for data it has not
/// read yet, would make the kernel answer those with a reset and drop the data still
/// queued for the peer (seen with siw's rstream as the client in the guest).
const LINGER: Duration = Duration::from_secs(3);
/// How long a blocked call keeps polling before it sleeps on the completion channel.
const SPIN: Duration = Duration::from_micros(20);

/// A length of this library's as the C APIs' 32-bit one (saturating; never that large).
fn n32(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// A count as a C `int` (saturating).
fn ni(x: usize) -> c_int {
    c_int::try_from(x).unwrap_or(c_int::MAX)
}

/// The low 16 bits (sequence numbers and credits wrap at 16 bits).
fn lo16(x: u32) -> u16 {
    let b = x.to_le_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

/// The low 32 bits (a work request id's data part).
fn lo32(x: u64) -> u32 {
    let b = x.to_le_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Queue and buffer sizes of a socket (set before it connects, inherited by accepted ones).
#[derive(Clone, Copy)]
struct Sizes {
    sbuf: u32,
    rbuf: u32,
    sq: u32,
    rq: u32,
    inline: u32,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes { sbuf: DEF_MEM, rbuf: DEF_MEM, sq: DEF_SQSIZE, rq: DEF_RQSIZE, inline: DEF_INLINE }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Init,
    Listening,
    Connected,
    Disconnected,
    Error,
}

/// Memory of this library's that a peer writes into: a heap allocation used only through
/// raw pointers (never through a reference while a peer may write it).
struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    fn new(len: usize) -> Buf {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        Buf { len, ptr: Box::into_raw(b).cast() }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the boxed slice made in `new`, freed once here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// A connection's queue pair, memory and protocol counters.
struct Conn {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    ch: *mut ibv_comp_channel,
    sbuf: Buf,
    smr: *mut ibv_mr,
    tsgl: Buf,
    tmr: *mut ibv_mr,
    rbuf: Buf,
    rmr: *mut ibv_mr,
    sbuf_size: usize,
    rbuf_size: usize,
    sq_size: u32,
    rq_size: u32,
    /// Receives posted: the credits plus `RECV_SPARE`.
    recv_slots: u32,
    /// Data transfers up to this size go inline (from the caller's buffer).
    inline: usize,
    /// Free bytes of the send ring, and where the next copy goes.
    sbuf_avail: usize,
    shead: usize,
    /// Send queue entries free for data (the control slots are kept apart).
    sqe_avail: i64,
    /// Data messages sent, and the limit the peer granted.
    sseq_no: u16,
    sseq_comp: u16,
    /// Data messages consumed, and the count at which to grant more.
    rseq_no: u16,
    rseq_comp: u16,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    /// The lengths of the received messages not yet read (the front one partly read).
    rmsg: VecDeque<u32>,
    rbuf_offset: usize,
    /// Bytes of the ring free and not yet granted, and where the next grant starts.
    rbuf_avail: usize,
    rbuf_free_offset: usize,
    rbuf_msg_index: u32,
    /// The peer's target list, and the entry the next grant goes to.
    remote_sgl: Sge,
    remote_sge: u32,
    /// The entry of our own target list the next data goes to.
    target_sge: usize,
    /// The peer's byte order differs from ours.
    swap: bool,
    armed: bool,
}

/// A socket's state, under its lock.
struct Inner {
    phase: Phase,
    readable: bool,
    writable: bool,
    /// `SO_ERROR`.
    err: c_int,
    nonblock: bool,
    id: *mut rdma_cm_id,
    sizes: Sizes,
    /// Option bits set by `rsetsockopt` (per level), reported by `rgetsockopt`.
    so_opts: u64,
    tcp_opts: u64,
    keepalive_time: c_int,
    /// The connection's receives were flushed: the peer closed it (or it broke).
    peer_gone: bool,
    /// The peer sent its disconnect message: it reads nothing more.
    peer_disconnected: bool,
    conn: Option<Conn>,
}

// SAFETY: the raw pointers are handles to this library's objects (ids, queues, memory
// regions) and to memory the socket owns; they are used only under the socket's lock.
unsafe impl Send for Inner {}

/// An rsocket.
struct RSocket {
    /// The descriptor the program holds (an eventfd, never signalled).
    fd: c_int,
    inner: Mutex<Inner>,
}

static SOCKETS: Mutex<BTreeMap<c_int, Arc<RSocket>>> = Mutex::new(BTreeMap::new());

thread_local! {
    /// The calling thread is inside an r* call: a socket made from here (the engine's own
    /// TCP socket, with librspreload interposing `socket`) must be a kernel socket.
    static INSIDE: Cell<u32> = const { Cell::new(0) };
}

/// Marks the thread inside an r* call while alive.
struct Inside;

impl Inside {
    fn enter() -> Inside {
        INSIDE.with(|c| c.set(c.get() + 1));
        Inside
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

fn lookup(fd: c_int) -> Result<Arc<RSocket>> {
    SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).get(&fd).cloned().ok_or(libc::EBADF)
}

fn is_rsocket(fd: c_int) -> bool {
    SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).contains_key(&fd)
}

impl RSocket {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Runs an rdma_cm or verbs call of this library that returns 0 or -1 with errno.
fn check(rc: c_int) -> Result<()> {
    if rc == 0 { Ok(()) } else { Err(last_errno()) }
}

fn new_socket(id: *mut rdma_cm_id, sizes: Sizes) -> Result<Arc<RSocket>> {
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    let s = Arc::new(RSocket {
        fd,
        inner: Mutex::new(Inner {
            phase: Phase::Init,
            readable: false,
            writable: false,
            err: 0,
            nonblock: false,
            id,
            sizes,
            so_opts: 0,
            tcp_opts: 0,
            keepalive_time: 7200,
            peer_gone: false,
            peer_disconnected: false,
            conn: None,
        }),
    });
    SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).insert(fd, s.clone());
    Ok(s)
}

// SAFETY: repr(C) structures of integers, raw pointers and unions of them.
unsafe impl ZeroedC for ibv_send_wr {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_recv_wr {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_wc {}
// SAFETY: as above.
unsafe impl ZeroedC for rdma_conn_param {}

impl Conn {
    /// Makes the queue pair of `id` (resolved, or a connection request), registers the
    /// rings and posts the receives.
    fn create(id: *mut rdma_cm_id, sizes: Sizes) -> Result<Conn> {
        // SAFETY: `id` is a live id of this library's; C programs read its fields as well.
        let ctx = unsafe { (*id).verbs };
        // Within the device's queue depth (the receive queue also holds the spare receives).
        let sq = sizes.sq.clamp(QP_MIN_SIZE, QP_MAX_SIZE.min(MAX_QP_WR));
        let rq = sizes.rq.clamp(QP_MIN_SIZE, QP_MAX_SIZE.min(MAX_QP_WR - RECV_SPARE));
        // SAFETY: the calls check their arguments (a NULL context fails).
        let ch = unsafe { ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(last_errno());
        }
        // SAFETY: `ch` is the live channel made above.
        let chfd = unsafe { (*ch).fd };
        // SAFETY: fcntl on the channel's descriptor; blocked calls sleep in `rpoll`-style
        // waits instead of the read.
        unsafe { libc::fcntl(chfd, libc::F_SETFL, libc::O_NONBLOCK) };
        let slots = rq + RECV_SPARE;
        // SAFETY: as above.
        let cq = unsafe {
            ibv_create_cq(ctx, c_int::try_from(sq + slots).unwrap_or(c_int::MAX), std::ptr::null_mut(), ch, 0)
        };
        if cq.is_null() {
            // SAFETY: the channel made above, unused.
            unsafe { ibv_destroy_comp_channel(ch) };
            return Err(last_errno());
        }
        let mut conn = Conn {
            qp: std::ptr::null_mut(),
            cq,
            ch,
            sbuf: Buf::new(sizes.sbuf as usize),
            smr: std::ptr::null_mut(),
            tsgl: Buf::new(SGE_LEN * SGL_SIZE),
            tmr: std::ptr::null_mut(),
            rbuf: Buf::new(sizes.rbuf as usize + slots as usize * MSG_LEN),
            rmr: std::ptr::null_mut(),
            sbuf_size: sizes.sbuf as usize,
            rbuf_size: sizes.rbuf as usize,
            sq_size: sq,
            rq_size: rq,
            recv_slots: slots,
            inline: sizes.inline.min(crate::qp::MAX_INLINE) as usize,
            sbuf_avail: sizes.sbuf as usize,
            shead: 0,
            sqe_avail: i64::from(sq) - i64::from(CTRL_SLOTS),
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: lo16(rq >> 1),
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            rmsg: VecDeque::new(),
            rbuf_offset: 0,
            rbuf_avail: sizes.rbuf as usize >> 1,
            rbuf_free_offset: sizes.rbuf as usize >> 1,
            rbuf_msg_index: 0,
            remote_sgl: Sge::default(),
            remote_sge: 1,
            target_sge: 0,
            swap: false,
            armed: false,
        };
        let mut attr: ibv_qp_init_attr = zeroed();
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = IBV_QPT_RC;
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = sq;
        attr.cap.max_recv_wr = slots;
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 1;
        // Messages and descriptors always go inline, whatever the data threshold.
        attr.cap.max_inline_data = n32(conn.inline).max(n32(SGE_LEN));
        // SAFETY: a live id and a local, initialised attribute structure.
        if let Err(e) = check(unsafe { rdma_create_qp(id, std::ptr::null_mut(), &raw mut attr) }) {
            conn.release(id);
            return Err(e);
        }
        // SAFETY: as above; rdma_create_qp set the fields.
        let (qp, pd) = unsafe { ((*id).qp, (*id).pd) };
        conn.qp = qp;
        let access = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        // SAFETY: each buffer is owned by the connection and outlives its registration
        // (released in `release` before the buffers drop).
        unsafe {
            conn.smr = ibv_reg_mr(pd, conn.sbuf.ptr.cast(), conn.sbuf.len, IBV_ACCESS_LOCAL_WRITE as c_int);
            conn.tmr = ibv_reg_mr(pd, conn.tsgl.ptr.cast(), conn.tsgl.len, access);
            conn.rmr = ibv_reg_mr(pd, conn.rbuf.ptr.cast(), conn.rbuf.len, access);
        }
        if conn.smr.is_null() || conn.tmr.is_null() || conn.rmr.is_null() {
            let e = last_errno();
            conn.release(id);
            return Err(e);
        }
        for _ in 0..slots {
            if let Err(e) = conn.post_recv() {
                conn.release(id);
                return Err(e);
            }
        }
        Ok(conn)
    }

    /// Destroys the queue pair, the queue and the registrations (the buffers go with `self`).
    fn release(&mut self, id: *mut rdma_cm_id) {
        // SAFETY: the objects were made by `create` and are destroyed once (the pointers are
        // cleared); the queue pair goes before the memory its work requests name.
        unsafe {
            if !self.qp.is_null() {
                rdma_destroy_qp(id);
                self.qp = std::ptr::null_mut();
            }
            for mr in [&mut self.smr, &mut self.tmr, &mut self.rmr] {
                if !mr.is_null() {
                    ibv_dereg_mr(*mr);
                    *mr = std::ptr::null_mut();
                }
            }
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
                self.cq = std::ptr::null_mut();
            }
            if !self.ch.is_null() {
                ibv_destroy_comp_channel(self.ch);
                self.ch = std::ptr::null_mut();
            }
        }
    }

    fn chfd(&self) -> c_int {
        // SAFETY: the channel lives as long as the connection's resources.
        unsafe { (*self.ch).fd }
    }

    /// The connection private data this end sends.
    fn conn_data(&self) -> ConnData {
        // SAFETY: live memory regions of the connection.
        let (tkey, rkey) = unsafe { ((*self.tmr).rkey, (*self.rmr).rkey) };
        ConnData {
            version: VERSION,
            flags: FLAG_IOMAP | if cfg!(target_endian = "big") { FLAG_NET } else { 0 },
            credits: lo16(self.rq_size),
            iomap_scale: 0,
            target_sgl: Sge { addr: self.tsgl.ptr as u64, key: tkey, length: n32(SGL_SIZE) },
            data_buf: Sge { addr: self.rbuf.ptr as u64, key: rkey, length: n32(self.rbuf_size >> 1) },
        }
    }

    /// Takes in the peer's connection private data.
    fn save(&mut self, peer: &ConnData) {
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1;
        self.swap = peer.swapped();
        self.set_target(0, peer.data_buf);
        self.sseq_comp = peer.credits;
    }

    /// Entry `i` of our target list (the peer writes these).
    fn target(&self, i: usize) -> Sge {
        // SAFETY: `i` < SGL_SIZE: inside the live target list; volatile reads because the
        // peer's Writes change it behind the compiler's back (ordered before the message
        // that announced them, which this thread took from the completion queue).
        unsafe {
            let p = self.tsgl.ptr.add(i * SGE_LEN);
            Sge {
                addr: std::ptr::read_volatile(p.cast::<u64>()),
                key: std::ptr::read_volatile(p.add(8).cast::<u32>()),
                length: std::ptr::read_volatile(p.add(12).cast::<u32>()),
            }
        }
    }

    fn set_target(&mut self, i: usize, s: Sge) {
        // SAFETY: as `target`; the entry is ours to change until the peer grants it again.
        unsafe {
            let p = self.tsgl.ptr.add(i * SGE_LEN);
            std::ptr::write_volatile(p.cast::<u64>(), s.addr);
            std::ptr::write_volatile(p.add(8).cast::<u32>(), s.key);
            std::ptr::write_volatile(p.add(12).cast::<u32>(), s.length);
        }
    }

    fn post_recv(&mut self) -> Result<()> {
        // SAFETY: the live receive memory region.
        let lkey = unsafe { (*self.rmr).lkey };
        let mut sge = ibv_sge {
            addr: self.rbuf.ptr as u64 + (self.rbuf_size + self.rbuf_msg_index as usize * MSG_LEN) as u64,
            length: n32(MSG_LEN),
            lkey,
        };
        let mut wr: ibv_recv_wr = zeroed();
        wr.wr_id = WR_RECV | u64::from(self.rbuf_msg_index);
        wr.sg_list = &raw mut sge;
        wr.num_sge = 1;
        self.rbuf_msg_index = (self.rbuf_msg_index + 1) % self.recv_slots;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live queue pair and a local, well-formed request.
        match unsafe { crate::qp::post_recv(self.qp, &raw mut wr, &raw mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Posts one send work request (signalled: the queue pair signals all).
    fn post(&mut self, wr: &mut ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live queue pair; the request and its SGL live across the call (inline
        // data and SGEs are read at post time).
        match unsafe { crate::qp::post_send(self.qp, wr, &raw mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Sends a message word alone (an inline Send).
    fn post_msg(&mut self, m: u32, wr_id: u64) -> Result<()> {
        let bytes = m.to_ne_bytes();
        let mut sge = ibv_sge { addr: bytes.as_ptr() as u64, length: n32(MSG_LEN), lkey: 0 };
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &raw mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_INLINE;
        self.post(&mut wr)
    }

    /// An RDMA Write of `sgl` to (`addr`, `rkey`), then the message word `m` that tells
    /// the peer about it.
    fn post_write_msg(
        &mut self,
        sgl: &mut [ibv_sge],
        m: u32,
        inline: bool,
        addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = u64::from(m);
        wr.sg_list = sgl.as_mut_ptr();
        wr.num_sge = ni(sgl.len());
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = if inline { IBV_SEND_INLINE } else { 0 };
        wr.wr.rdma.remote_addr = addr;
        wr.wr.rdma.rkey = rkey;
        self.post(&mut wr)?;
        self.post_msg(m, u64::from(msg(msg_op(m), 0)) | WR_MSG_SEND)
    }

    fn can_send(&self) -> bool {
        self.sqe_avail >= 2
            && self.sbuf_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn two_ctrl_avail(&self) -> bool {
        (self.ctrl_seqno.wrapping_add(1).wrapping_sub(self.ctrl_max_seqno) as i32) < 0
    }

    fn all_sends_done(&self) -> bool {
        i64::from(self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno)) + self.sqe_avail
            == i64::from(self.sq_size)
    }

    /// Grants the peer the free half of the ring (or just more credits) when due.
    fn update_credits(&mut self) {
        let half = self.rbuf_size >> 1;
        let due = self.rbuf_avail >= half || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        if !due || !self.two_ctrl_avail() {
            return;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(lo16(self.rq_size >> 1));
        let limit = u32::from(self.rseq_no.wrapping_add(lo16(self.rq_size)));
        if self.rbuf_avail >= half {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            // SAFETY: the live receive memory region.
            let rkey = unsafe { (*self.rmr).rkey };
            let grant = Sge {
                addr: self.rbuf.ptr as u64 + self.rbuf_free_offset as u64,
                key: rkey,
                length: n32(half),
            };
            let bytes = grant.to_bytes(self.swap);
            let mut sge = [ibv_sge { addr: bytes.as_ptr() as u64, length: n32(SGE_LEN), lkey: 0 }];
            let to = self.remote_sgl.addr + u64::from(self.remote_sge) * SGE_LEN as u64;
            let key = self.remote_sgl.key;
            let _ = self.post_write_msg(&mut sge, msg(OP_SGL, limit), true, to, key);
            self.rbuf_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length.max(1) {
                self.remote_sge = 0;
            }
        } else {
            let _ = self.post_msg(msg(OP_SGL, limit), u64::from(msg(OP_SGL, limit)));
        }
    }
}

impl Inner {
    fn connected(&self) -> bool {
        self.phase == Phase::Connected
    }

    fn have_rdata(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.rmsg.is_empty())
    }

    fn can_send(&self) -> bool {
        self.connected() && self.writable && self.conn.as_ref().is_some_and(Conn::can_send)
    }

    fn update_credits(&mut self) {
        if self.connected()
            && let Some(c) = self.conn.as_mut()
        {
            c.update_credits();
        }
    }

    /// Takes the completions of the connection's queue; reposts the receives it consumed.
    fn poll_cq(&mut self) -> Result<()> {
        let Some(c) = self.conn.as_mut() else { return Ok(()) };
        let mut wcs: [ibv_wc; 16] = [zeroed(); 16];
        let mut received = 0;
        loop {
            // SAFETY: a live queue and an array of 16 writable entries.
            let n = unsafe { crate::cq::poll_cq(c.cq, ni(wcs.len()), wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                if wc.wr_id & WR_RECV != 0 {
                    if wc.status != IBV_WC_SUCCESS {
                        // Flushed: the connection went down under us.
                        self.peer_gone = true;
                        if self.phase == Phase::Connected {
                            self.phase = Phase::Disconnected;
                            self.readable = false;
                            self.writable = false;
                        }
                        continue;
                    }
                    received += 1;
                    let slot = (lo32(wc.wr_id) % c.recv_slots) as usize;
                    let mut word = [0u8; MSG_LEN];
                    // SAFETY: the message slot inside the live ring; the engine wrote it
                    // before it queued the completion this thread just took.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            c.rbuf.ptr.add(c.rbuf_size + slot * MSG_LEN),
                            word.as_mut_ptr(),
                            MSG_LEN,
                        );
                    }
                    let m = u32::from_ne_bytes(word);
                    match msg_op(m) {
                        OP_SGL => c.sseq_comp = lo16(msg_data(m)),
                        OP_IOMAP_SGL => {}
                        OP_CTRL => match msg_data(m) {
                            CTRL_DISCONNECT => {
                                self.peer_disconnected = true;
                                self.phase = Phase::Disconnected;
                                self.readable = false;
                                self.writable = false;
                            }
                            CTRL_SHUTDOWN => {
                                if self.writable {
                                    self.readable = false;
                                } else {
                                    self.phase = Phase::Disconnected;
                                    self.readable = false;
                                }
                            }
                            _ => {}
                        },
                        _ => c.rmsg.push_back(msg_data(m)),
                    }
                } else {
                    let d = lo32(wc.wr_id);
                    match msg_op(d) {
                        OP_SGL => c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1),
                        OP_CTRL => {
                            c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1);
                            if msg_data(d) == CTRL_DISCONNECT {
                                self.phase = Phase::Disconnected;
                            }
                        }
                        OP_IOMAP_SGL => c.sqe_avail += 1,
                        _ => {
                            c.sqe_avail += 1;
                            c.sbuf_avail += msg_data(d) as usize;
                        }
                    }
                    if wc.status != IBV_WC_SUCCESS && self.phase == Phase::Connected {
                        self.phase = Phase::Error;
                        self.err = libc::EIO;
                    }
                }
            }
            if (n as usize) < wcs.len() {
                break;
            }
        }
        if self.phase == Phase::Connected {
            for _ in 0..received {
                if let Err(e) = c.post_recv() {
                    self.phase = Phase::Error;
                    self.err = e;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// One round of progress: credits, completions, credits.
    fn process(&mut self) -> Result<()> {
        self.update_credits();
        let r = self.poll_cq();
        self.update_credits();
        r
    }

    /// Arms the queue for a completion event; its channel's descriptor.
    fn arm(&mut self) -> Option<c_int> {
        let c = self.conn.as_mut()?;
        if !c.armed {
            // SAFETY: a live queue.
            unsafe { crate::cq::req_notify_cq(c.cq, 0) };
            c.armed = true;
        }
        Some(c.chfd())
    }

    /// Reads and acknowledges the completion events that came (the channel is
    /// non-blocking).
    fn drain_events(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        let mut cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a live channel; writable locals.
        while unsafe { ibv_get_cq_event(c.ch, &raw mut cq, &raw mut ctx) } == 0 {
            // SAFETY: the event just read from the live queue.
            unsafe { ibv_ack_cq_events(c.cq, 1) };
            c.armed = false;
        }
    }
}

/// Waits until `test` holds (progressing the connection), or fails with `EWOULDBLOCK`
/// when `nonblock`, or the deadline passes (`ETIMEDOUT`). Sleeps without the lock.
fn wait<'a>(
    s: &'a RSocket,
    nonblock: bool,
    deadline: Option<Instant>,
    test: impl Fn(&Inner) -> bool,
) -> Result<MutexGuard<'a, Inner>> {
    let start = Instant::now();
    loop {
        let mut g = s.lock();
        let r = g.process();
        if test(&g) {
            return Ok(g);
        }
        r?;
        if nonblock {
            return Err(libc::EWOULDBLOCK);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(libc::ETIMEDOUT);
        }
        if start.elapsed() < SPIN {
            drop(g);
            std::thread::yield_now();
            continue;
        }
        let Some(fd) = g.arm() else { return Err(libc::ENOTCONN) };
        let _ = g.process();
        if test(&g) {
            return Ok(g);
        }
        drop(g);
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&raw mut p, 1, NAP_MS) };
        s.lock().drain_events();
    }
}

/// `rsocket`: a stream socket (`SOCK_STREAM`, optionally with `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`) over IPv4 or IPv6.
///
/// # Safety
///
/// None (no pointers).
#[unsafe(export_name = "iwarp_rsocket")]
pub unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, _protocol: c_int) -> c_int {
    // A socket the library itself makes while inside an r* call (librspreload hands its
    // `socket` to us) or on one of its own threads is a kernel socket: refuse it, and the
    // preload falls back to the real `socket`.
    let ours = std::thread::current().name().is_some_and(|n| n.starts_with("iwarp"));
    if INSIDE.with(Cell::get) > 0 || ours {
        set_errno(libc::EAFNOSUPPORT);
        return -1;
    }
    let _inside = Inside::enter();
    minus1_call("rsocket", || {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(libc::EAFNOSUPPORT);
        }
        let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        if base != libc::SOCK_STREAM {
            return Err(libc::ENOTSUP);
        }
        let mut id = std::ptr::null_mut();
        // SAFETY: a writable local; NULL channel: a synchronous id.
        check(unsafe {
            rdma_create_id(std::ptr::null_mut(), &raw mut id, std::ptr::null_mut(), RDMA_PS_TCP)
        })?;
        let s = new_socket(id, Sizes::default())?;
        s.lock().nonblock = ty & libc::SOCK_NONBLOCK != 0;
        Ok(s.fd)
    })
}

/// Copies a socket address of `len` bytes into an owned one.
fn read_addr(addr: *const sockaddr, len: socklen_t) -> Result<libc::sockaddr_storage> {
    if addr.is_null() || len as usize > std::mem::size_of::<libc::sockaddr_storage>() || len < 2 {
        return Err(libc::EINVAL);
    }
    // SAFETY: sockaddr_storage is plain data; zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: the caller passes `len` readable bytes (checked non-null, bounded above).
    unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), (&raw mut ss).cast::<u8>(), len as usize) };
    Ok(ss)
}

/// `rbind`.
///
/// # Safety
///
/// `addr` points to `len` readable bytes.
#[unsafe(export_name = "iwarp_rbind")]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rbind", || {
        let s = lookup(socket)?;
        let mut ss = read_addr(addr, len)?;
        let g = s.lock();
        // SAFETY: a live id; a local address.
        check(unsafe { rdma_bind_addr(g.id, (&raw mut ss).cast()) })?;
        Ok(0)
    })
}

/// `rlisten`: connection requests queue on the socket's own event channel.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rlisten")]
pub unsafe extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rlisten", || {
        let s = lookup(socket)?;
        let mut g = s.lock();
        if g.phase == Phase::Listening {
            return Ok(0);
        }
        if g.phase != Phase::Init {
            return Err(libc::EINVAL);
        }
        // The connection requests come on the id's own channel, as with rdma-core's rsockets:
        // no second channel (a process that counts its descriptors, as netcat does, sees
        // fewer of them).
        // SAFETY: a live id.
        check(unsafe { rdma_listen(g.id, backlog) })?;
        g.phase = Phase::Listening;
        set_fd_nonblock(listen_fd(&g), g.nonblock);
        Ok(0)
    })
}

fn listen_fd(g: &Inner) -> c_int {
    // SAFETY: the socket's live id, and its channel, which lives as long as the id.
    unsafe { (*(*g.id).channel).fd }
}

fn set_fd_nonblock(fd: c_int, on: bool) {
    // SAFETY: fcntl on a descriptor of this library's.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        libc::fcntl(fd, libc::F_SETFL, flags);
    }
}

/// Copies `src` (a socket address of this library's) out as `getsockname` does.
fn copy_addr(src: *const sockaddr, addr: *mut sockaddr, len: *mut socklen_t) -> Result<()> {
    if src.is_null() || addr.is_null() || len.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `src` is an address inside a live id; its family says its size.
    let family = c_int::from(unsafe { (*src).sa_family });
    let size = if family == libc::AF_INET6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // SAFETY: the caller passes a writable length and `*len` writable bytes at `addr`.
    unsafe {
        let n = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping(src.cast::<u8>(), addr.cast::<u8>(), n);
        *len = n32(size);
    }
    Ok(())
}

/// `raccept`: the next connection request, answered; a new connected socket.
///
/// # Safety
///
/// `addr`/`len` NULL or as for `accept(2)`.
#[unsafe(export_name = "iwarp_raccept")]
pub unsafe extern "C" fn raccept(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let _inside = Inside::enter();
    minus1_call("raccept", || {
        let s = lookup(socket)?;
        let (id, sizes) = {
            let g = s.lock();
            if g.phase != Phase::Listening {
                return Err(libc::EINVAL);
            }
            (g.id, g.sizes)
        };
        loop {
            // Waits on the id's channel (blocking or not as the socket is).
            let (child, data, param) = take_request(id)?;
            match accept_one(child, &data, param, sizes) {
                Ok(new) => {
                    if !addr.is_null() && !len.is_null() {
                        let g = new.lock();
                        // SAFETY: a live id.
                        let peer = unsafe { rdma_get_peer_addr(g.id) };
                        let _ = copy_addr(peer, addr, len);
                    }
                    return Ok(new.fd);
                }
                Err(e) => {
                    tracing::debug!(errno = e, "rsockets: a connection request was refused");
                }
            }
        }
    })
}

/// Answers one connection request on `child`: its queue pair and rings, our private data.
fn accept_one(
    child: *mut rdma_cm_id,
    data: &[u8],
    param: rdma_conn_param,
    sizes: Sizes,
) -> Result<Arc<RSocket>> {
    let reject = |e| {
        // SAFETY: the request's live id; destroyed once here.
        unsafe {
            rdma_reject(child, std::ptr::null(), 0);
            rdma_destroy_id(child);
        }
        e
    };
    let Some(peer) = ConnData::decode(data) else { return Err(reject(libc::EPROTO)) };
    let mut conn = Conn::create(child, sizes).map_err(reject)?;
    conn.save(&peer);
    let reply = conn.conn_data().encode();
    let mut p = param;
    p.private_data = reply.as_ptr().cast();
    p.private_data_len = CONN_DATA_LEN_U8;
    // SAFETY: a live id; the parameters and private data live across the call.
    if let Err(e) = check(unsafe { rdma_accept(child, &raw mut p) }) {
        conn.release(child);
        // SAFETY: the request's id, destroyed once.
        unsafe { rdma_destroy_id(child) };
        return Err(e);
    }
    let s = match new_socket(child, sizes) {
        Ok(s) => s,
        Err(e) => {
            conn.release(child);
            return Err(e);
        }
    };
    {
        let mut g = s.lock();
        g.conn = Some(conn);
        g.phase = Phase::Connected;
        g.readable = true;
        g.writable = true;
        g.update_credits();
    }
    Ok(s)
}

/// `rconnect`: resolves, connects and exchanges the private data; blocks until connected
/// (also for a non-blocking socket, which then never sees `EINPROGRESS`).
///
/// # Safety
///
/// `addr` points to `len` readable bytes.
#[unsafe(export_name = "iwarp_rconnect")]
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rconnect", || {
        let s = lookup(socket)?;
        let mut dst = read_addr(addr, len)?;
        let mut g = s.lock();
        match g.phase {
            Phase::Init => {}
            Phase::Connected => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        let id = g.id;
        let r = (|| {
            // SAFETY: a live synchronous id; a local address.
            check(unsafe { rdma_resolve_addr(id, std::ptr::null_mut(), (&raw mut dst).cast(), 2000) })?;
            // SAFETY: as above.
            check(unsafe { rdma_resolve_route(id, 2000) })?;
            let mut conn = Conn::create(id, g.sizes)?;
            let data = conn.conn_data().encode();
            let mut p: rdma_conn_param = zeroed();
            p.private_data = data.as_ptr().cast();
            p.private_data_len = CONN_DATA_LEN_U8;
            p.flow_control = 1;
            p.retry_count = 7;
            p.rnr_retry_count = 7;
            // As rdma-core's rsockets over iWARP: an initiator depth of one.
            p.initiator_depth = 1;
            // SAFETY: a live id; the parameters and private data live across the call.
            if let Err(e) = check(unsafe { rdma_connect(id, &raw mut p) }) {
                conn.release(id);
                return Err(e);
            }
            let Some(peer) = ConnData::decode(&sync_reply(id)?) else {
                conn.release(id);
                // SAFETY: a live id.
                unsafe { rdma_disconnect(id) };
                return Err(libc::EPROTO);
            };
            conn.save(&peer);
            Ok(conn)
        })();
        match r {
            Ok(conn) => {
                g.conn = Some(conn);
                g.phase = Phase::Connected;
                g.readable = true;
                g.writable = true;
                g.update_credits();
                Ok(0)
            }
            Err(e) => {
                g.phase = Phase::Error;
                g.err = e;
                Err(e)
            }
        }
    })
}

/// Sends `len` bytes from `buf`; bytes sent, or the error if none were.
fn send(s: &RSocket, buf: *const u8, len: usize, flags: c_int) -> Result<usize> {
    let nonblock_call = flags & libc::MSG_DONTWAIT != 0;
    let mut left = len;
    let mut at = buf;
    let mut olen = OLAP_START;
    let mut g = s.lock();
    if !g.connected() && g.phase != Phase::Disconnected {
        return Err(if g.phase == Phase::Error { g.err.max(libc::EIO) } else { libc::ENOTCONN });
    }
    let nonblock = nonblock_call || g.nonblock;
    if len == 0 {
        return Ok(0);
    }
    while left > 0 {
        if !g.can_send() {
            drop(g);
            g = match wait(s, nonblock, None, |i| i.can_send() || !i.writable || !i.connected()) {
                Ok(g) => g,
                Err(e) => {
                    return if left < len { Ok(len - left) } else { Err(e) };
                }
            };
            if !g.writable || !g.connected() {
                return if left < len { Ok(len - left) } else { Err(libc::ECONNRESET) };
            }
        }
        let Some(c) = g.conn.as_mut() else { return Err(libc::ENOTCONN) };
        let mut xfer = if olen < left {
            let x = olen;
            if olen < MAX_TRANSFER {
                olen <<= 1;
            }
            x
        } else {
            left
        };
        xfer = xfer.min(c.sbuf_avail).min(c.target(c.target_sge).length as usize);
        let t = c.target(c.target_sge);
        let r = if xfer <= c.inline {
            let mut sge = [ibv_sge { addr: at as u64, length: n32(xfer), lkey: 0 }];
            c.write_data(&mut sge, xfer, true, t)
        } else {
            // SAFETY: the live send memory region.
            let lkey = unsafe { (*c.smr).lkey };
            let first = xfer.min(c.sbuf_size - c.shead);
            // SAFETY: `at` has `left` >= xfer readable bytes (the caller's buffer); the
            // ring has `first` bytes from `shead` and `xfer - first` from 0, free (counted
            // in sbuf_avail, which only completions of earlier Writes give back).
            unsafe {
                std::ptr::copy_nonoverlapping(at, c.sbuf.ptr.add(c.shead), first);
                std::ptr::copy_nonoverlapping(at.add(first), c.sbuf.ptr, xfer - first);
            }
            let mut sgl = [
                ibv_sge { addr: c.sbuf.ptr as u64 + c.shead as u64, length: n32(first), lkey },
                ibv_sge { addr: c.sbuf.ptr as u64, length: n32(xfer - first), lkey },
            ];
            let n = if xfer > first { 2 } else { 1 };
            let r = c.write_data(&mut sgl[..n], xfer, false, t);
            c.shead = (c.shead + xfer) % c.sbuf_size;
            r
        };
        if let Err(e) = r {
            g.phase = Phase::Error;
            g.err = e;
            return if left < len { Ok(len - left) } else { Err(e) };
        }
        left -= xfer;
        // SAFETY: still inside the caller's buffer (xfer <= left before).
        at = unsafe { at.add(xfer) };
    }
    Ok(len)
}

impl Conn {
    /// Writes `len` bytes into the target entry `t` and sends the data message.
    fn write_data(&mut self, sgl: &mut [ibv_sge], len: usize, inline: bool, t: Sge) -> Result<()> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 2;
        self.sbuf_avail -= len;
        let rest = Sge { addr: t.addr + len as u64, key: t.key, length: t.length - n32(len) };
        self.set_target(self.target_sge, rest);
        if rest.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE;
        }
        self.post_write_msg(sgl, msg(OP_DATA, n32(len)), inline, t.addr, t.key)
    }
}

/// Receives up to `len` bytes into `buf`: bytes received, 0 at the end of the stream.
fn recv(s: &RSocket, buf: *mut u8, len: usize, flags: c_int) -> Result<usize> {
    let nonblock_call = flags & libc::MSG_DONTWAIT != 0;
    let mut g = s.lock();
    if g.phase == Phase::Init || g.phase == Phase::Listening {
        return Err(libc::ENOTCONN);
    }
    if len == 0 {
        return Ok(0);
    }
    let nonblock = nonblock_call || g.nonblock;
    let mut left = len;
    let at = buf;
    loop {
        if !g.have_rdata() {
            drop(g);
            g = match wait(s, nonblock, None, |i| i.have_rdata() || !i.readable) {
                Ok(g) => g,
                Err(e) => return if left < len { Ok(len - left) } else { Err(e) },
            };
        }
        let Some(c) = g.conn.as_mut() else { return Ok(len - left) };
        if flags & libc::MSG_PEEK != 0 {
            let mut off = c.rbuf_offset;
            let mut copied = 0;
            for &m in &c.rmsg {
                if copied == left {
                    break;
                }
                let n = (m as usize).min(left - copied);
                c.copy_out(off, n, at, copied);
                off = (off + n) % c.rbuf_size;
                copied += n;
            }
            return Ok(copied);
        }
        while left > 0 {
            let Some(front) = c.rmsg.front_mut() else { break };
            let n = if left < *front as usize {
                *front -= n32(left);
                left
            } else {
                let n = *front as usize;
                c.rmsg.pop_front();
                c.rseq_no = c.rseq_no.wrapping_add(1);
                n
            };
            c.copy_out(c.rbuf_offset, n, at, len - left);
            c.rbuf_offset = (c.rbuf_offset + n) % c.rbuf_size;
            c.rbuf_avail += n;
            left -= n;
        }
        if left == 0 || flags & libc::MSG_WAITALL == 0 || !g.readable {
            break;
        }
    }
    g.update_credits();
    Ok(len - left)
}

impl Conn {
    /// Copies `n` bytes of the ring from `off` (wrapping) to `dst + at`.
    fn copy_out(&self, off: usize, n: usize, dst: *mut u8, at: usize) {
        let first = n.min(self.rbuf_size - off);
        // SAFETY: the ring bytes were written by the peer before the message this end took
        // from the queue; `dst` has room for `at + n` bytes (the caller's length).
        unsafe {
            std::ptr::copy_nonoverlapping(self.rbuf.ptr.add(off), dst.add(at), first);
            std::ptr::copy_nonoverlapping(self.rbuf.ptr, dst.add(at + first), n - first);
        }
    }
}

fn ssize(r: Result<usize>) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn guarded(name: &str, f: impl FnOnce() -> Result<usize>) -> isize {
    let _inside = Inside::enter();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!(function = name, "internal error (panic): returning EIO");
        Err(libc::EIO)
    });
    ssize(r)
}

/// `rrecv`.
///
/// # Safety
///
/// `buf` has `len` writable bytes.
#[unsafe(export_name = "iwarp_rrecv")]
pub unsafe extern "C" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guarded("rrecv", || {
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        let n = recv(&*lookup(socket)?, buf.cast(), len, flags)?;
        if n == 0 {
            // The end of the stream. errno is cleared: a program that reads errno after a
            // return of 0 (rstream's loops take EAGAIN there as "try again") must not see a
            // stale EAGAIN from the library's own non-blocking calls and spin.
            set_errno(0);
        }
        Ok(n)
    })
}

/// `rrecvfrom` (the source is the peer).
///
/// # Safety
///
/// As `recvfrom(2)`.
#[unsafe(export_name = "iwarp_rrecvfrom")]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
) -> isize {
    guarded("rrecvfrom", || {
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        let s = lookup(socket)?;
        let n = recv(&s, buf.cast(), len, flags)?;
        if !src.is_null() && !srclen.is_null() {
            let id = s.lock().id;
            // SAFETY: a live id.
            let _ = copy_addr(unsafe { rdma_get_peer_addr(id) }, src, srclen);
        }
        Ok(n)
    })
}

/// The iovecs of a call, read.
fn iovecs(iov: *const libc::iovec, n: c_int) -> Result<Vec<libc::iovec>> {
    if n < 0 || (n > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes `n` readable iovecs (checked above).
    Ok(unsafe { std::slice::from_raw_parts(iov, n as usize) }.to_vec())
}

/// Runs `io` on each non-empty buffer of `iov` in turn (with the bytes moved so far) until one
/// is only partly filled or fails: the bytes moved, or the error when nothing moved.
fn each_iovec(
    iov: &[libc::iovec],
    mut io: impl FnMut(&libc::iovec, usize) -> Result<usize>,
) -> Result<usize> {
    let mut total = 0;
    for v in iov.iter().filter(|v| v.iov_len > 0) {
        match io(v, total) {
            Ok(n) => {
                total += n;
                if n < v.iov_len {
                    break;
                }
            }
            Err(e) => return if total > 0 { Ok(total) } else { Err(e) },
        }
    }
    Ok(total)
}

fn recvv(s: &RSocket, iov: &[libc::iovec], flags: c_int) -> Result<usize> {
    // Only the first buffer that gets data may wait; the rest take what is there.
    each_iovec(iov, |v, total| {
        let f = if total == 0 { flags } else { flags | libc::MSG_DONTWAIT };
        recv(s, v.iov_base.cast(), v.iov_len, f)
    })
}

fn sendv(s: &RSocket, iov: &[libc::iovec], flags: c_int) -> Result<usize> {
    each_iovec(iov, |v, _| send(s, v.iov_base.cast(), v.iov_len, flags))
}

/// The buffers of a `struct msghdr` (ancillary data is not looked at).
fn msg_iovecs(msg: *const c_void) -> Result<Vec<libc::iovec>> {
    let m = msg.cast::<libc::msghdr>();
    if m.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a readable msghdr (checked non-null).
    let (iov, n) = unsafe { ((*m).msg_iov, ni((*m).msg_iovlen)) };
    iovecs(iov, n)
}

/// `rrecvmsg` (no ancillary data).
///
/// # Safety
///
/// `msg` points to a `struct msghdr` as for `recvmsg(2)`.
#[unsafe(export_name = "iwarp_rrecvmsg")]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut c_void, flags: c_int) -> isize {
    guarded("rrecvmsg", || recvv(&*lookup(socket)?, &msg_iovecs(msg)?, flags))
}

/// `rread`.
///
/// # Safety
///
/// As [`rrecv`].
#[unsafe(export_name = "iwarp_rread")]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: the caller's contract is rrecv's.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rreadv`.
///
/// # Safety
///
/// `iov` points to `iovcnt` iovecs of writable buffers.
#[unsafe(export_name = "iwarp_rreadv")]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const c_void, iovcnt: c_int) -> isize {
    guarded("rreadv", || recvv(&*lookup(socket)?, &iovecs(iov.cast(), iovcnt)?, 0))
}

/// `rsend`.
///
/// # Safety
///
/// `buf` has `len` readable bytes.
#[unsafe(export_name = "iwarp_rsend")]
pub unsafe extern "C" fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    guarded("rsend", || {
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        send(&*lookup(socket)?, buf.cast(), len, flags)
    })
}

/// `rsendto` (a stream socket ignores the destination).
///
/// # Safety
///
/// As [`rsend`].
#[unsafe(export_name = "iwarp_rsendto")]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    _dst: *const sockaddr,
    _dstlen: socklen_t,
) -> isize {
    // SAFETY: the caller's contract is rsend's.
    unsafe { rsend(socket, buf, len, flags) }
}

/// `rsendmsg` (no ancillary data).
///
/// # Safety
///
/// `msg` points to a `struct msghdr` as for `sendmsg(2)`.
#[unsafe(export_name = "iwarp_rsendmsg")]
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const c_void, flags: c_int) -> isize {
    guarded("rsendmsg", || sendv(&*lookup(socket)?, &msg_iovecs(msg)?, flags))
}

/// `rwrite`.
///
/// # Safety
///
/// As [`rsend`].
#[unsafe(export_name = "iwarp_rwrite")]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
    // SAFETY: the caller's contract is rsend's.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rwritev`.
///
/// # Safety
///
/// `iov` points to `iovcnt` iovecs of readable buffers.
#[unsafe(export_name = "iwarp_rwritev")]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const c_void, iovcnt: c_int) -> isize {
    guarded("rwritev", || sendv(&*lookup(socket)?, &iovecs(iov.cast(), iovcnt)?, 0))
}

/// The poll events of an rsocket now (after a round of progress).
fn revents(s: &RSocket, events: i16) -> i16 {
    let mut g = s.lock();
    match g.phase {
        Phase::Listening => {
            let mut p = libc::pollfd { fd: listen_fd(&g), events, revents: 0 };
            // SAFETY: one live pollfd, no wait.
            unsafe { libc::poll(&raw mut p, 1, 0) };
            p.revents
        }
        Phase::Init => 0,
        _ => {
            let _ = g.process();
            let mut r = 0;
            if events & libc::POLLIN != 0 && (g.have_rdata() || !g.readable) {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && g.can_send() {
                r |= libc::POLLOUT;
            }
            match g.phase {
                // Hung up once the data that came before the disconnect is read: a program
                // that takes POLLHUP as the end (rstream's -T a does) still gets it all.
                Phase::Disconnected if !g.have_rdata() => r |= libc::POLLHUP,
                Phase::Error => r |= libc::POLLERR,
                _ => {}
            }
            r
        }
    }
}

/// The descriptor an rsocket's readiness wakes (armed), if any.
fn wake_fd(s: &RSocket) -> Option<c_int> {
    let mut g = s.lock();
    match g.phase {
        Phase::Listening => Some(listen_fd(&g)),
        Phase::Init => None,
        _ => g.arm(),
    }
}

fn do_poll(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int> {
    let socks: Vec<Option<Arc<RSocket>>> = fds.iter().map(|p| lookup(p.fd).ok()).collect();
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let mut armed = false;
    let start = Instant::now();
    loop {
        let mut ready = 0;
        let mut plain: Vec<libc::pollfd> = Vec::new();
        for (p, s) in fds.iter_mut().zip(&socks) {
            match s {
                Some(s) => {
                    p.revents = revents(s, p.events);
                    if p.revents != 0 {
                        ready += 1;
                    }
                }
                None => plain.push(libc::pollfd { fd: p.fd, events: p.events, revents: 0 }),
            }
        }
        if !plain.is_empty() {
            // SAFETY: a live array of pollfds; no wait.
            let n = unsafe { libc::poll(plain.as_mut_ptr(), plain.len() as libc::nfds_t, 0) };
            if n < 0 {
                return Err(last_errno());
            }
            let mut it = plain.iter();
            for (p, s) in fds.iter_mut().zip(&socks) {
                if s.is_none()
                    && let Some(q) = it.next()
                {
                    p.revents = q.revents;
                    if q.revents != 0 {
                        ready += 1;
                    }
                }
            }
        }
        if ready > 0 || timeout == 0 {
            return Ok(ready);
        }
        // A completion is usually a few microseconds away: look again for a moment before
        // sleeping on the channels.
        if start.elapsed() < SPIN {
            std::thread::yield_now();
            continue;
        }
        // Arm every rsocket, look once more (a completion may have come in between), then
        // sleep on the program's descriptors and the rsockets' channels together.
        if !armed {
            armed = true;
            continue;
        }
        let mut wait_set = plain.clone();
        let mut woken = Vec::new();
        for s in socks.iter().flatten() {
            if let Some(fd) = wake_fd(s) {
                wait_set.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
                woken.push(s.clone());
            }
        }
        let nap = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(0);
                }
                c_int::try_from(left.as_millis()).unwrap_or(NAP_MS).clamp(1, NAP_MS)
            }
            None => NAP_MS,
        };
        // SAFETY: a live array of pollfds.
        let n = unsafe { libc::poll(wait_set.as_mut_ptr(), wait_set.len() as libc::nfds_t, nap) };
        if n < 0 {
            let e = last_errno();
            if e != libc::EINTR {
                return Err(e);
            }
        }
        for s in &woken {
            let mut g = s.lock();
            if g.phase != Phase::Listening {
                g.drain_events();
            }
        }
        armed = false;
    }
}

/// `rpoll`: `poll(2)` over rsockets and other descriptors together.
///
/// # Safety
///
/// As `poll(2)`: `fds` points to `nfds` readable and writable entries.
#[unsafe(export_name = "iwarp_rpoll")]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rpoll", || {
        if nfds == 0 {
            // SAFETY: no descriptors: a plain sleep.
            return Ok(unsafe { libc::poll(fds, 0, timeout) });
        }
        if fds.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: the caller passes `nfds` entries (checked non-null).
        let fds =
            unsafe { std::slice::from_raw_parts_mut(fds, usize::try_from(nfds).map_err(|_| libc::EINVAL)?) };
        if !fds.iter().any(|p| is_rsocket(p.fd)) {
            // SAFETY: as poll(2).
            let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
            return if n < 0 { Err(last_errno()) } else { Ok(n) };
        }
        do_poll(fds, timeout)
    })
}

/// `rselect`: `select(2)` over rsockets and other descriptors (through [`rpoll`]).
///
/// # Safety
///
/// As `select(2)`.
#[unsafe(export_name = "iwarp_rselect")]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    r: *mut c_void,
    w: *mut c_void,
    e: *mut c_void,
    timeout: *mut c_void,
) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rselect", || {
        let (r, w, e) = (r.cast::<libc::fd_set>(), w.cast::<libc::fd_set>(), e.cast::<libc::fd_set>());
        if !(0..=ni(libc::FD_SETSIZE)).contains(&nfds) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's sets (NULL or readable and writable).
        let isset = |set: *mut libc::fd_set, fd| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
        let mut fds = Vec::new();
        for fd in 0..nfds {
            let mut ev = 0;
            if isset(r, fd) {
                ev |= libc::POLLIN;
            }
            if isset(w, fd) {
                ev |= libc::POLLOUT;
            }
            if isset(e, fd) {
                ev |= libc::POLLPRI;
            }
            if ev != 0 {
                fds.push(libc::pollfd { fd, events: ev, revents: 0 });
            }
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: the caller passes a readable timeval (checked non-null).
            let tv = unsafe { *timeout.cast::<libc::timeval>() };
            c_int::try_from(tv.tv_sec * 1000 + tv.tv_usec / 1000).unwrap_or(c_int::MAX)
        };
        let n = if fds.iter().any(|p| is_rsocket(p.fd)) {
            do_poll(&mut fds, ms)?
        } else {
            // SAFETY: a live array of pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                return Err(last_errno());
            }
            n
        };
        // SAFETY: the caller's sets, as above.
        unsafe {
            for set in [r, w, e] {
                if !set.is_null() {
                    libc::FD_ZERO(set);
                }
            }
        }
        let mut count = 0;
        for p in &fds {
            let mut hit = |set: *mut libc::fd_set, on: bool| {
                if on && !set.is_null() {
                    // SAFETY: as above; `p.fd` < nfds <= FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    count += 1;
                }
            };
            let bad = p.revents & (libc::POLLHUP | libc::POLLERR) != 0;
            hit(r, p.events & libc::POLLIN != 0 && (p.revents & libc::POLLIN != 0 || bad));
            hit(w, p.events & libc::POLLOUT != 0 && (p.revents & libc::POLLOUT != 0 || bad));
            hit(e, p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0);
        }
        let _ = n;
        Ok(count)
    })
}

/// Sends a control word (waiting for a control slot) and waits until every send is done.
fn send_ctrl(s: &RSocket, ctrl: u32) -> Result<()> {
    let deadline = Some(Instant::now() + CLOSE_WAIT);
    let mut g =
        wait(s, false, deadline, |i| !i.connected() || i.conn.as_ref().is_some_and(Conn::ctrl_avail))?;
    if g.connected()
        && let Some(c) = g.conn.as_mut()
    {
        c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
        let m = msg(OP_CTRL, ctrl);
        c.post_msg(m, u64::from(m))?;
    }
    drop(g);
    wait(s, false, deadline, |i| !i.connected() || i.conn.as_ref().is_some_and(Conn::all_sends_done))
        .map(drop)
}

fn shutdown(s: &RSocket, how: c_int) -> Result<()> {
    let ctrl = {
        let mut g = s.lock();
        if !g.connected() {
            return if g.phase == Phase::Disconnected { Ok(()) } else { Err(libc::ENOTCONN) };
        }
        match how {
            libc::SHUT_RDWR => {
                g.readable = false;
                g.writable = false;
                CTRL_DISCONNECT
            }
            libc::SHUT_WR => {
                g.writable = false;
                if g.readable { CTRL_SHUTDOWN } else { CTRL_DISCONNECT }
            }
            libc::SHUT_RD => {
                g.readable = false;
                if g.writable {
                    return Ok(());
                }
                CTRL_DISCONNECT
            }
            _ => return Err(libc::EINVAL),
        }
    };
    send_ctrl(s, ctrl)
}

/// `rshutdown`: tells the peer (a shutdown or disconnect control message).
///
/// # Safety
///
/// None.
#[unsafe(export_name = "iwarp_rshutdown")]
pub unsafe extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rshutdown", || {
        shutdown(&*lookup(socket)?, how)?;
        Ok(0)
    })
}

/// `rclose`: disconnects (telling the peer) and frees the socket.
///
/// # Safety
///
/// None.
#[unsafe(export_name = "iwarp_rclose")]
pub unsafe extern "C" fn rclose(socket: c_int) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rclose", || {
        let s = SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).remove(&socket).ok_or(libc::EBADF)?;
        if s.lock().connected() {
            let _ = shutdown(&s, libc::SHUT_RDWR);
        }
        let linger = {
            let g = s.lock();
            g.conn.is_some() && !g.peer_disconnected && !g.peer_gone
        };
        if linger {
            drop(wait(&s, false, Some(Instant::now() + LINGER), |i| i.peer_gone));
        }
        let mut g = s.lock();
        let id = g.id;
        if let Some(mut c) = g.conn.take() {
            // SAFETY: a live id; then its resources, once.
            unsafe { rdma_disconnect(id) };
            c.release(id);
        }
        // SAFETY: the socket's id and channel, destroyed once (the socket is unregistered).
        unsafe {
            rdma_destroy_id(id);
            libc::close(s.fd);
        }
        Ok(0)
    })
}

/// `rgetpeername`.
///
/// # Safety
///
/// As `getpeername(2)`.
#[unsafe(export_name = "iwarp_rgetpeername")]
pub unsafe extern "C" fn rgetpeername(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    minus1_call("rgetpeername", || {
        let id = lookup(socket)?.lock().id;
        // SAFETY: a live id.
        copy_addr(unsafe { rdma_get_peer_addr(id) }, addr, len)?;
        Ok(0)
    })
}

/// `rgetsockname`.
///
/// # Safety
///
/// As `getsockname(2)`.
#[unsafe(export_name = "iwarp_rgetsockname")]
pub unsafe extern "C" fn rgetsockname(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    minus1_call("rgetsockname", || {
        let id = lookup(socket)?.lock().id;
        // SAFETY: a live id.
        copy_addr(unsafe { rdma_get_local_addr(id) }, addr, len)?;
        Ok(0)
    })
}

/// The ring size for `SO_RCVBUF`/`SO_SNDBUF` = `v`: twice the value, as the kernel's
/// buffers, within 4 KiB .. 64 MiB.
fn ring_size(v: c_int) -> u32 {
    (v.max(1).unsigned_abs().min(MAX_RING >> 1) << 1).max(2 * n32(SNDLOWAT))
}

/// Reads an `int` option value.
fn int_val(val: *const c_void, len: socklen_t) -> Result<c_int> {
    if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least an int's bytes, readable (checked above).
    Ok(unsafe { val.cast::<c_int>().read_unaligned() })
}

fn set_bit(opts: &mut u64, name: c_int, on: bool) {
    let bit = 1u64 << (name as u32 & 63);
    if on {
        *opts |= bit;
    } else {
        *opts &= !bit;
    }
}

/// `rsetsockopt`: `SOL_SOCKET` `SO_REUSEADDR`, `SO_RCVBUF`/`SO_SNDBUF` (before connecting:
/// the ring sizes, twice the value as the kernel does), `SO_LINGER`, `SO_KEEPALIVE`,
/// `SO_OOBINLINE`; `IPPROTO_TCP` `TCP_NODELAY`, `TCP_KEEPIDLE`/`KEEPCNT`/`KEEPINTVL`,
/// `TCP_MAXSEG` (recorded); `SOL_RDMA` queue sizes and inline size (before connecting).
/// Anything else: `ENOTSUP`.
///
/// # Safety
///
/// `val` points to `len` readable bytes.
#[unsafe(export_name = "iwarp_rsetsockopt")]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rsetsockopt", || {
        let s = lookup(socket)?;
        let mut g = s.lock();
        let unconnected = matches!(g.phase, Phase::Init | Phase::Listening);
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
                let on = int_val(val, len)?;
                let mut v = on;
                // SAFETY: a live id; the value is a local int.
                unsafe {
                    rdma_set_option(
                        g.id,
                        RDMA_OPTION_ID as c_int,
                        RDMA_OPTION_ID_REUSEADDR as c_int,
                        (&raw mut v).cast(),
                        std::mem::size_of::<c_int>(),
                    )
                };
                set_bit(&mut g.so_opts, name, on != 0);
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                let v = int_val(val, len)?;
                if g.conn.is_none() {
                    g.sizes.rbuf = ring_size(v);
                }
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                let v = int_val(val, len)?;
                if g.conn.is_none() {
                    g.sizes.sbuf = ring_size(v);
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if val.is_null() || (len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a readable linger structure (checked above).
                let l = unsafe { val.cast::<libc::linger>().read_unaligned() };
                set_bit(&mut g.so_opts, name, l.l_onoff != 0);
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE | libc::SO_OOBINLINE | libc::SO_REUSEPORT)
            | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                let on = int_val(val, len)? != 0;
                set_bit(&mut g.so_opts, name, on);
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
                let on = int_val(val, len)? != 0;
                set_bit(&mut g.tcp_opts, name, on);
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                let v = int_val(val, len)?;
                if v <= 0 {
                    return Err(libc::EINVAL);
                }
                g.keepalive_time = v;
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG) => {}
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE | RDMA_ROUTE) => {
                if !unconnected || g.conn.is_some() {
                    return Err(libc::EINVAL);
                }
                match name {
                    RDMA_SQSIZE => g.sizes.sq = (int_val(val, len)?.max(0) as u32).min(QP_MAX_SIZE),
                    RDMA_RQSIZE => g.sizes.rq = (int_val(val, len)?.max(0) as u32).min(QP_MAX_SIZE),
                    RDMA_INLINE => g.sizes.inline = (int_val(val, len)?.max(0) as u32).min(QP_MAX_SIZE),
                    // No direct placement, and routes are InfiniBand paths: accepted, unused.
                    _ => {}
                }
            }
            _ => {
                tracing::debug!(level, name, "rsetsockopt: option not supported");
                return Err(libc::ENOTSUP);
            }
        }
        Ok(0)
    })
}

/// `rgetsockopt`: the options [`rsetsockopt`] takes, and `SO_ERROR` (read and cleared),
/// `SO_TYPE`.
///
/// # Safety
///
/// `val` points to `*len` writable bytes; `len` is writable.
#[unsafe(export_name = "iwarp_rgetsockopt")]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rgetsockopt", || {
        let s = lookup(socket)?;
        if val.is_null() || len.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a readable length (checked non-null).
        let room = unsafe { *len } as usize;
        let mut g = s.lock();
        let bit = |opts: u64| c_int::from(opts & (1u64 << (name as u32 & 63)) != 0);
        let v: c_int = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut g.err),
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.sizes.rbuf as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.sizes.sbuf as c_int,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if room < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                let l = libc::linger { l_onoff: bit(g.so_opts), l_linger: 0 };
                // SAFETY: room for a linger structure (checked above); a writable length.
                unsafe {
                    val.cast::<libc::linger>().write_unaligned(l);
                    *len = n32(std::mem::size_of::<libc::linger>());
                }
                return Ok(0);
            }
            (
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE | libc::SO_REUSEPORT,
            ) => bit(g.so_opts),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(g.so_opts),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(g.tcp_opts),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => g.keepalive_time,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
            (SOL_RDMA, RDMA_SQSIZE) => g.sizes.sq as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => g.sizes.rq as c_int,
            (SOL_RDMA, RDMA_INLINE) => g.sizes.inline as c_int,
            (SOL_RDMA, RDMA_IOMAPSIZE) => 0,
            _ => {
                tracing::debug!(level, name, "rgetsockopt: option not supported");
                return Err(libc::ENOTSUP);
            }
        };
        if room < std::mem::size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: room for an int (checked above); a writable length.
        unsafe {
            val.cast::<c_int>().write_unaligned(v);
            *len = n32(std::mem::size_of::<c_int>());
        }
        Ok(0)
    })
}

/// `rfcntl`: `F_GETFL` and `F_SETFL` (`O_NONBLOCK`). The C prototype is variadic; the
/// third argument is read as the register (or stack slot) it arrives in.
///
/// # Safety
///
/// None (the argument is a value).
#[unsafe(export_name = "iwarp_rfcntl")]
pub unsafe extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int {
    let _inside = Inside::enter();
    minus1_call("rfcntl", || {
        let s = lookup(socket)?;
        let mut g = s.lock();
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDWR | if g.nonblock { libc::O_NONBLOCK } else { 0 }),
            libc::F_SETFL => {
                g.nonblock = arg & c_long::from(libc::O_NONBLOCK) != 0;
                if g.phase == Phase::Listening {
                    set_fd_nonblock(listen_fd(&g), g.nonblock);
                }
                Ok(0)
            }
            _ => Err(libc::ENOTSUP),
        }
    })
}

symver!("IWARP_PRIVATE_1":
    iwarp_rsocket, iwarp_rbind, iwarp_rlisten, iwarp_raccept, iwarp_rconnect, iwarp_rshutdown,
    iwarp_rclose, iwarp_rrecv, iwarp_rrecvfrom, iwarp_rrecvmsg, iwarp_rsend, iwarp_rsendto,
    iwarp_rsendmsg, iwarp_rread, iwarp_rreadv, iwarp_rwrite, iwarp_rwritev, iwarp_rselect,
    iwarp_rgetpeername, iwarp_rgetsockname, iwarp_rsetsockopt, iwarp_rgetsockopt, iwarp_rfcntl,
    iwarp_rpoll,
);
