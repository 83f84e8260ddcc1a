//! What rsockets put on the wire (rdma-core 44's stream rsockets, as docs/upper-layers.md
//! describes them): the connection private data, the 32-bit message word and the buffer
//! descriptors a receiver writes into its peer's target list.

/// The protocol version both ends put in the connection private data.
pub const VERSION: u8 = 1;
/// Connection flag: the sender's descriptors are in network byte order (a big-endian host).
pub const FLAG_NET: u8 = 1 << 0;
/// Connection flag: the sender has a target list for direct-placement maps (`riomap`).
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of the connection private data (as `rdma_conn_param` counts them).
pub const CONN_DATA_LEN_U8: u8 = 40;
/// Bytes of the connection private data.
pub const CONN_DATA_LEN: usize = CONN_DATA_LEN_U8 as usize;
/// Bytes of one buffer descriptor (address, key, length).
pub const SGE_LEN: usize = 16;
/// Descriptors in each end's target list.
pub const SGL_SIZE: usize = 2;
/// Bytes of a message (the 32-bit word).
pub const MSG_LEN: usize = 4;

/// Message operations (the word's top three bits).
pub const OP_DATA: u32 = 0;
/// The receiver granted credits; data: the sequence number the sender may reach.
pub const OP_SGL: u32 = 4;
/// A direct-placement map was written (not used by this implementation, ignored).
pub const OP_IOMAP_SGL: u32 = 6;
/// A control message; data: one of the `CTRL_*` values.
pub const OP_CTRL: u32 = 7;

/// Control: the sender closed both directions.
pub const CTRL_DISCONNECT: u32 = 0;
/// Control: keepalive (no effect).
pub const CTRL_KEEPALIVE: u32 = 1;
/// Control: the sender will send no more data.
pub const CTRL_SHUTDOWN: u32 = 2;

/// The message word of `op` with `data` (29 bits).
pub fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// The operation of a message word.
pub fn msg_op(m: u32) -> u32 {
    m >> 29
}

/// The data of a message word.
pub fn msg_data(m: u32) -> u32 {
    m & 0x1FFF_FFFF
}

/// A buffer descriptor: where the peer may write, with which key, how much.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// The tagged offset (the buffer's address in its owner's process).
    pub addr: u64,
    /// The steering tag.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl Sge {
    /// The descriptor in the layout the peer reads from its target list: native order, or
    /// swapped when the peer's byte order differs.
    pub fn to_bytes(self, swap: bool) -> [u8; SGE_LEN] {
        let (a, k, l) = if swap {
            (self.addr.swap_bytes(), self.key.swap_bytes(), self.length.swap_bytes())
        } else {
            (self.addr, self.key, self.length)
        };
        let mut b = [0u8; SGE_LEN];
        b[0..8].copy_from_slice(&a.to_ne_bytes());
        b[8..12].copy_from_slice(&k.to_ne_bytes());
        b[12..16].copy_from_slice(&l.to_ne_bytes());
        b
    }

    fn to_be(self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn from_be(b: &[u8]) -> Sge {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[0..8]);
        let mut k = [0u8; 4];
        k.copy_from_slice(&b[8..12]);
        let mut l = [0u8; 4];
        l.copy_from_slice(&b[12..16]);
        Sge { addr: u64::from_be_bytes(a), key: u32::from_be_bytes(k), length: u32::from_be_bytes(l) }
    }
}

/// The connection private data each end sends (in the MPA Request and Reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// `FLAG_*`.
    pub flags: u8,
    /// Receive credits: how many data messages the peer may send before it hears more.
    pub credits: u16,
    /// The size of the direct-placement target list, as a scale (0: none).
    pub iomap_scale: u8,
    /// The sender's target list: where the peer writes its buffer descriptors.
    pub target_sgl: Sge,
    /// The first buffer the peer may write data into.
    pub data_buf: Sge,
}

impl ConnData {
    /// The 40 bytes: version, flags, credits (big-endian), three reserved bytes, the iomap
    /// scale, then the two descriptors with big-endian fields.
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.iomap_scale;
        self.target_sgl.to_be(&mut b[8..24]);
        self.data_buf.to_be(&mut b[24..40]);
        b
    }

    /// Reads the private data of a peer; `None` if too short or of another version.
    pub fn decode(b: &[u8]) -> Option<ConnData> {
        if b.len() < CONN_DATA_LEN || b[0] != VERSION {
            return None;
        }
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            iomap_scale: b[7],
            target_sgl: Sge::from_be(&b[8..24]),
            data_buf: Sge::from_be(&b[24..40]),
        })
    }

    /// Whether the sender's byte order differs from this host's.
    pub fn swapped(&self) -> bool {
        (self.flags & FLAG_NET != 0) != cfg!(target_endian = "big")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_layout() {
        let c = ConnData {
            version: VERSION,
            flags: FLAG_IOMAP,
            credits: 384,
            iomap_scale: 0,
            target_sgl: Sge { addr: 0x1122_3344_5566_7788, key: 0xaabb_ccdd, length: 2 },
            data_buf: Sge { addr: 0x10, key: 7, length: 0x1_0000 },
        };
        let b = c.encode();
        assert_eq!(&b[0..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&b[16..24], &[0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 2]);
        assert_eq!(&b[24..40], &[0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 7, 0, 1, 0, 0]);
        assert_eq!(ConnData::decode(&b), Some(c));
        assert!(!c.swapped());
    }

    #[test]
    fn bad_conn_data_is_refused() {
        let mut b = [0u8; CONN_DATA_LEN];
        assert_eq!(ConnData::decode(&b), None, "version 0");
        b[0] = VERSION;
        assert!(ConnData::decode(&b).is_some());
        assert_eq!(ConnData::decode(&b[..39]), None, "short");
    }

    #[test]
    fn message_word() {
        let m = msg(OP_SGL, 384 + 17);
        assert_eq!(m, 0x8000_0191);
        assert_eq!((msg_op(m), msg_data(m)), (OP_SGL, 401));
        assert_eq!(msg(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg_data(msg(OP_DATA, 0x3FFF_FFFF)), 0x1FFF_FFFF, "data is 29 bits");
    }

    #[test]
    fn descriptor_bytes() {
        let s = Sge { addr: 0x0102_0304_0506_0708, key: 0x0a0b_0c0d, length: 0x100 };
        let native = s.to_bytes(false);
        assert_eq!(u64::from_ne_bytes(native[0..8].try_into().unwrap()), s.addr);
        let swapped = s.to_bytes(true);
        assert_eq!(u32::from_ne_bytes(swapped[12..16].try_into().unwrap()), 0x100u32.swap_bytes());
    }
}
