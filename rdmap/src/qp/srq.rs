//! The shared receive queue: receive buffers any queue pair attached to it may take.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use super::wr::{PostError, RecvWr};

/// A shared receive queue: receive buffers any of the queue pairs attached to it may take,
/// one per incoming message, in posting order.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<Mutex<SrqInner>>,
}

#[derive(Debug)]
struct SrqInner {
    wrs: VecDeque<RecvWr>,
    max: usize,
}

impl SharedReceiveQueue {
    /// A shared receive queue holding at most `max` buffers.
    pub fn new(max: usize) -> SharedReceiveQueue {
        SharedReceiveQueue { inner: Arc::new(Mutex::new(SrqInner { wrs: VecDeque::new(), max })) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SrqInner> {
        // A panic while holding the lock cannot leave the queue inconsistent (each operation
        // is a single push or pop), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Posts a receive buffer.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let mut q = self.lock();
        if q.wrs.len() >= q.max {
            return Err(PostError::QueueFull);
        }
        q.wrs.push_back(wr);
        Ok(())
    }

    /// Buffers posted and not yet taken.
    pub fn len(&self) -> usize {
        self.lock().wrs.len()
    }

    /// Whether no buffer is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn take(&self) -> Option<RecvWr> {
        self.lock().wrs.pop_front()
    }
}
