//! The order of a rank's calls among processes ([`CallOrder`]): each call starts after the
//! previous one has ended, on whatever streams they were issued (their kernels share the
//! rank's scratch, flags and device epochs). Where two calls come on the same stream, stream
//! order already gives that, and the wait is left out: one driver call fewer per call.

use std::cell::Cell;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::driver::stream::{StreamIds, StreamKey};
use crate::{Error, Result};

/// The end of a rank's previous call among processes, and the stream it was recorded on.
///
/// ```no_run
/// use ringccl::internals::driver::stream::StreamIds;
/// use ringccl::internals::resources::order::CallOrder;
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let (a, b) = (ctx.new_stream()?, ctx.new_stream()?);
/// let mut order = CallOrder::new(ctx.new_event(None)?, StreamIds::load()?);
/// order.wait(&a, 0)?; // the first call: a wait on an event never recorded
/// order.record(&a, 0)?;
/// order.wait(&a, 0)?; // the same stream: no wait
/// order.wait(&b, 0)?; // another stream: it waits for the call on `a`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CallOrder {
    end: CudaEvent,
    ids: StreamIds,
    /// The stream [`CallOrder::record`] last recorded `end` on; `None` before the first call,
    /// and when that stream has no key.
    on: Option<StreamKey>,
    /// The key [`CallOrder::wait`] last asked the driver for, taken by the next
    /// [`CallOrder::record`] on the same handle (one query per call, not two). A stale one
    /// (its stream destroyed meanwhile) names an id no stream has any more: the next call
    /// then waits, never skips wrongly.
    asked: Cell<Option<StreamKey>>,
}

impl CallOrder {
    /// The order before the first call, around `end` (an event never recorded yet, or
    /// recorded only where nothing is pending).
    pub fn new(end: CudaEvent, ids: StreamIds) -> Self {
        CallOrder {
            end,
            ids,
            on: None,
            asked: Cell::new(None),
        }
    }

    /// The end of the previous call, for host waits and queries (a scratch growth, the
    /// watchdog, a deregistration). Only [`CallOrder::record`] records it.
    pub fn end(&self) -> &CudaEvent {
        &self.end
    }

    /// Orders `stream` (rank `rank`'s) after the previous call: nothing more than a stream id
    /// query when the previous call's end was recorded on this very stream, else
    /// `cuStreamWaitEvent` on it.
    pub fn wait(&self, stream: &CudaStream, rank: usize) -> Result<()> {
        if self.on.is_some() {
            let key = self.ids.key(stream);
            self.asked.set(key);
            if key == self.on {
                return Ok(());
            }
        }
        stream
            .wait(&self.end)
            .map_err(|e| Error::cuda("cuStreamWaitEvent", Some(rank), e))
    }

    /// Records the end of this call on `stream` (rank `rank`'s) and remembers the stream. A
    /// failed record forgets it, so that the next call waits.
    pub fn record(&mut self, stream: &CudaStream, rank: usize) -> Result<()> {
        self.on = None;
        self.end
            .record(stream)
            .map_err(|e| Error::cuda("cuEventRecord", Some(rank), e))?;
        self.on = match self.asked.take() {
            Some(k) if k.0 == stream.cu_stream() as usize => Some(k),
            _ => self.ids.key(stream),
        };
        Ok(())
    }
}
