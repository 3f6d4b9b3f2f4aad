//! The buffers a collective reads and writes, and how a call names them per rank.
//!
//! A collective takes one [`Io`] per rank: the rank's send (input) buffer, its receive (output)
//! buffer, or one buffer used in place. Buffers are anything that implements [`DeviceSlice`]
//! (read) or [`DeviceSliceMut`] (written): cudarc's [`CudaSlice`], [`CudaView`] and
//! [`CudaViewMut`]. An [`Io`] records each buffer as a plain [`RawBuf`] (address, length,
//! device) — all that validation looks at — and keeps the buffers borrowed until the call
//! returns.
//!
//! # The work is asynchronous
//!
//! A collective only *enqueues* work on the streams it is given and returns; as with NCCL, the
//! buffers are read and written after the call returns. Before reading the results on the host,
//! or reusing or freeing a buffer from anywhere that is not ordered after those streams,
//! synchronise the streams (`stream.synchronize()`), or make the other stream wait on them.
//!
//! # cudarc's event tracking
//!
//! When a cudarc context has several streams, every [`CudaSlice`] carries a read and a write
//! event, and cudarc's own operations wait on them. ringccl takes part in this: once a call is
//! validated, each rank's stream first waits for earlier cudarc-tracked writes (and, for a
//! buffer it writes, reads) of that rank's buffers, and after the call's work is enqueued the
//! buffers' read/write events are recorded on the rank's stream. The executor makes each rank's
//! stream wait, at the end of a call, for every step of any rank that touched that rank's
//! memory, so these events cover the whole collective: a later cudarc operation on another
//! stream (a copy to the host, a free when the slice is dropped) waits for the collective.
//! Reading a buffer's address ([`DeviceSlice::raw`], when an [`Io`] is built) orders nothing
//! of the caller's: cudarc exposes the address only with a stream to wait on, and ringccl gives
//! it a private stream of the buffer's context handle that runs nothing. cudarc tracks only
//! for a handle that has created a stream; that private stream is one, so buffers of a handle
//! that never created a stream of its own (allocated on its default stream) are tracked too.
//! For buffers allocated while event tracking was disabled
//! ([`CudaContext::disable_event_tracking`], an `unsafe` promise to order by hand) none of
//! this happens and ordering is entirely the caller's, as with NCCL.
//!
//! [`CudaContext::disable_event_tracking`]: cudarc::driver::CudaContext::disable_event_tracking

use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    SyncOnDrop,
};

/// A buffer as plain data: device address in bytes, length in elements, device ordinal.
///
/// This is all that validation looks at, so it can be tested without a GPU.
///
/// ```
/// use ringccl::RawBuf;
/// let b = RawBuf::new(0x7000_0000, 256, 1);
/// assert_eq!(b.byte_end(4), Some(0x7000_0000 + 1024));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawBuf {
    /// Device address of element 0.
    pub ptr: u64,
    /// Length in elements.
    pub len: usize,
    /// Ordinal of the device that owns the memory.
    pub ordinal: usize,
}

impl RawBuf {
    /// A buffer of `len` elements at `ptr` on device `ordinal`.
    pub const fn new(ptr: u64, len: usize, ordinal: usize) -> Self {
        Self { ptr, len, ordinal }
    }

    /// The address one past the last byte, for elements of `elem_size` bytes (`None` on
    /// overflow).
    pub fn byte_end(&self, elem_size: usize) -> Option<u64> {
        let bytes = u64::try_from(self.len.checked_mul(elem_size)?).ok()?;
        self.ptr.checked_add(bytes)
    }

    /// The buffer starting `elems` elements further (`None` on overflow). The length shrinks
    /// accordingly (to 0 if `elems` is past the end).
    ///
    /// ```
    /// use ringccl::RawBuf;
    /// let b = RawBuf::new(0x1000, 10, 0);
    /// assert_eq!(b.offset(4, 8), Some(RawBuf::new(0x1000 + 32, 6, 0)));
    /// ```
    pub fn offset(&self, elems: usize, elem_size: usize) -> Option<RawBuf> {
        let bytes = u64::try_from(elems.checked_mul(elem_size)?).ok()?;
        Some(RawBuf {
            ptr: self.ptr.checked_add(bytes)?,
            len: self.len.saturating_sub(elems),
            ordinal: self.ordinal,
        })
    }
}

/// Device memory a collective may read: `len` elements of `T` at a device address, owned by
/// one device.
///
/// Implemented for cudarc's [`CudaSlice`], [`CudaView`] and [`CudaViewMut`].
///
/// # Safety
///
/// An implementation promises that [`raw`](DeviceSlice::raw) describes memory that is valid to
/// read (and, through [`DeviceSliceMut`], to write) as `len` elements of `T` on device
/// `ordinal` for as long as the value is borrowed, and that the memory is not accessed by
/// anything else that the tracking methods do not order against the given stream.
///
/// ```no_run
/// use ringccl::DeviceSlice;
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let buf = ctx.default_stream().alloc_zeros::<f32>(1024)?;
/// let raw = DeviceSlice::<f32>::raw(&buf);
/// assert_eq!((raw.len, raw.ordinal), (1024, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe trait DeviceSlice<T> {
    /// Address, length in elements, and device ordinal: plain data. For cudarc's types,
    /// reading it enqueues nothing on any stream of the caller's (see the module docs).
    fn raw(&self) -> RawBuf;

    /// Orders a read of the memory on `stream` after earlier tracked writes; the returned guard,
    /// dropped once the read is enqueued, marks the read done at that point of `stream`.
    ///
    /// The default does no tracking (for memory the caller orders by hand).
    fn track_read<'s>(&'s self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        let _ = stream;
        SyncOnDrop::Record(None)
    }
}

/// Device memory a collective may write. See [`DeviceSlice`].
///
/// # Safety
///
/// As for [`DeviceSlice`], and the memory must be valid to write.
///
/// ```no_run
/// use ringccl::DeviceSlice;
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let mut buf = ctx.default_stream().alloc_zeros::<u8>(64)?;
/// let view = buf.slice_mut(16..32);
/// assert_eq!(DeviceSlice::<u8>::raw(&view).len, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe trait DeviceSliceMut<T>: DeviceSlice<T> {
    /// Orders a write of the memory on `stream` after earlier tracked reads and writes; the
    /// returned guard, dropped once the write is enqueued, marks the write done at that point.
    ///
    /// The default does no tracking.
    fn track_write<'s>(&'s mut self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        let _ = stream;
        SyncOnDrop::Record(None)
    }
}

/// The device ordinal of the context that owns a cudarc slice or view.
fn owner_ordinal<T>(s: &impl cudarc::driver::DeviceSlice<T>) -> usize {
    s.stream().context().ordinal()
}

/// A stream of the context handle `ctx` that ringccl uses for nothing but reading buffer
/// addresses, created once per handle and kept while the handle is in use (`None` if the driver
/// cannot create one).
///
/// It also keeps the handle in cudarc's multi-stream mode: cudarc orders a slice's uses and its
/// free by the slice's events only when the handle that allocated it has created a stream
/// ([`CudaContext::is_managing_stream_synchronization`]). A handle that never did (buffers
/// allocated on its default stream) would otherwise free a buffer while a collective on
/// ringccl's streams still reads or writes it. The key is the handle, not the CUDA context:
/// two handles of one device's primary context count their streams apart.
fn address_stream(ctx: &Arc<CudaContext>) -> Option<Arc<CudaStream>> {
    static STREAMS: Mutex<Vec<(usize, Arc<CudaStream>)>> = Mutex::new(Vec::new());
    // The stream kept here holds its handle alive, so the key is never reused while kept.
    let key = Arc::as_ptr(ctx) as usize;
    let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, s)) = streams.iter().find(|(k, _)| *k == key) {
        return Some(s.clone());
    }
    // Handles nothing else refers to any more (only their stream here): no slice of theirs is
    // left to order, so their streams go.
    streams.retain(|(_, s)| Arc::strong_count(s.context()) > 1);
    let s = ctx.new_stream().ok()?;
    streams.push((key, s.clone()));
    Some(s)
}

/// Reads the address of a cudarc slice or view, without ordering anything of the caller's.
///
/// cudarc hands an address out only with a stream to order the access on: it enqueues there a
/// wait for the buffer's last tracked write, and returns a record of the read. Here that
/// stream is one of ringccl's own that runs nothing ([`address_stream`]), so the wait orders
/// nothing the caller sees, and the record is forgotten (dropping it would re-record the
/// buffer's read event and hide an earlier read on another stream from the collective's own
/// tracking). Only if the driver cannot create that stream is the buffer's own stream used.
fn address<T>(s: &impl DevicePtr<T>) -> u64 {
    let own = s.stream();
    let private = address_stream(own.context());
    let (ptr, record) = s.device_ptr(private.as_ref().unwrap_or(own));
    // `SyncOnDrop` only borrows; forgetting it skips the event record and nothing else.
    std::mem::forget(record);
    ptr
}

// SAFETY: a `CudaSlice` owns `len` elements on its context's device for its whole life, and the
// borrow keeps it alive; tracking goes through cudarc's own `device_ptr`.
unsafe impl<T> DeviceSlice<T> for CudaSlice<T> {
    fn raw(&self) -> RawBuf {
        RawBuf::new(address(self), self.len(), self.ordinal())
    }
    fn track_read<'s>(&'s self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        self.device_ptr(stream).1
    }
}

// SAFETY: as above; `&mut` access to a `CudaSlice` is exclusive.
unsafe impl<T> DeviceSliceMut<T> for CudaSlice<T> {
    fn track_write<'s>(&'s mut self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        self.device_ptr_mut(stream).1
    }
}

// SAFETY: a view borrows its `CudaSlice`, so the memory stays valid while the view lives.
unsafe impl<T> DeviceSlice<T> for CudaView<'_, T> {
    fn raw(&self) -> RawBuf {
        RawBuf::new(address(self), self.len(), owner_ordinal(self))
    }
    fn track_read<'s>(&'s self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        self.device_ptr(stream).1
    }
}

// SAFETY: a mutable view borrows its `CudaSlice` mutably, so it is the only access.
unsafe impl<T> DeviceSlice<T> for CudaViewMut<'_, T> {
    fn raw(&self) -> RawBuf {
        RawBuf::new(address(self), self.len(), owner_ordinal(self))
    }
    fn track_read<'s>(&'s self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        self.device_ptr(stream).1
    }
}

// SAFETY: as above.
unsafe impl<T> DeviceSliceMut<T> for CudaViewMut<'_, T> {
    fn track_write<'s>(&'s mut self, stream: &'s CudaStream) -> SyncOnDrop<'s> {
        self.device_ptr_mut(stream).1
    }
}

/// One rank's buffers for a collective call.
///
/// * [`Io::out_of_place`]: separate input and output;
/// * [`Io::in_place`]: one buffer, laid out as NCCL's in-place convention for the collective
///   (the output buffer, holding this rank's input at the collective's place: all-reduce,
///   broadcast, reduce: the whole buffer; all-gather and gather: element `rank * sendcount`;
///   for reduce-scatter and scatter the buffer is the *input*, and the output is element
///   `rank * recvcount` of it);
/// * [`Io::send_only`], [`Io::recv_only`]: ranks that only give or only get data (broadcast,
///   reduce, gather, scatter non-roots).
///
/// A buffer given where the collective does not use it (a non-root's receive buffer in
/// reduce, for instance) is ignored, as in NCCL.
///
/// The borrows last as long as the `Io`; the work itself runs after the call returns, so
/// synchronise the streams before reusing the buffers (see the [module docs](self)).
///
/// The buffers must be `Sync` (inputs) and `Send` (outputs), as cudarc's slices and views of
/// every [`DeviceElement`](crate::DeviceElement) are: a communicator of several GPUs may issue
/// each rank's part of a call, the tracking of its buffers included, on a host thread of that
/// rank's ([`Config::rank_threads`](crate::Config::rank_threads)).
///
/// ```no_run
/// use ringccl::{Communicator, Io, RedOp};
/// let comm = Communicator::all()?;
/// let n = comm.nranks();
/// let mut bufs = (0..n)
///     .map(|r| comm.stream(r).alloc_zeros::<f32>(1024))
///     .collect::<Result<Vec<_>, _>>()?;
/// let mut io: Vec<Io<f32>> = bufs.iter_mut().map(Io::in_place).collect();
/// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
/// comm.all_reduce(&mut io, 1024, RedOp::Sum, &streams)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Io<'a, T> {
    args: RankArgs,
    send_buf: Option<&'a (dyn DeviceSlice<T> + Sync)>,
    recv_buf: Option<&'a mut (dyn DeviceSliceMut<T> + Send)>,
}

impl<'a, T> Io<'a, T> {
    /// One buffer that is both input and output (NCCL's in-place layout for the collective).
    pub fn in_place<S: DeviceSliceMut<T> + Send + 'a>(buf: &'a mut S) -> Self {
        Io {
            args: RankArgs::in_place(buf.raw()),
            send_buf: None,
            recv_buf: Some(buf),
        }
    }

    /// Separate input and output buffers.
    pub fn out_of_place<S: DeviceSlice<T> + Sync + 'a, R: DeviceSliceMut<T> + Send + 'a>(
        send: &'a S,
        recv: &'a mut R,
    ) -> Self {
        Io {
            args: RankArgs::out_of_place(send.raw(), recv.raw()),
            send_buf: Some(send),
            recv_buf: Some(recv),
        }
    }

    /// Only an input (a root of broadcast or scatter, a non-root of reduce or gather).
    pub fn send_only<S: DeviceSlice<T> + Sync + 'a>(send: &'a S) -> Self {
        Io {
            args: RankArgs::send_only(send.raw()),
            send_buf: Some(send),
            recv_buf: None,
        }
    }

    /// Only an output (a non-root of broadcast or scatter).
    pub fn recv_only<R: DeviceSliceMut<T> + Send + 'a>(recv: &'a mut R) -> Self {
        Io {
            args: RankArgs::recv_only(recv.raw()),
            send_buf: None,
            recv_buf: Some(recv),
        }
    }

    /// The input buffer (for [`Io::in_place`], the one buffer).
    pub fn send(&self) -> Option<RawBuf> {
        self.args.send
    }

    /// The output buffer (for [`Io::in_place`], the one buffer).
    pub fn recv(&self) -> Option<RawBuf> {
        self.args.recv
    }

    /// Whether this was built with [`Io::in_place`].
    pub fn is_in_place(&self) -> bool {
        self.args.in_place
    }

    /// The plain description validation works on.
    pub(crate) fn args(&self) -> RankArgs {
        self.args
    }

    /// Enqueues on `stream` the waits for earlier tracked accesses of the buffers the call
    /// uses, and returns the guards that record this call's accesses when dropped.
    pub(crate) fn track<'s>(
        &'s mut self,
        stream: &'s CudaStream,
        uses_send: bool,
        uses_recv: bool,
    ) -> [SyncOnDrop<'s>; 2] {
        let (ts, tr) = self.tracking_plan(uses_send, uses_recv);
        let send = match (&self.send_buf, ts) {
            (Some(b), Track::Read) => b.track_read(stream),
            _ => SyncOnDrop::Record(None),
        };
        let recv = match (&mut self.recv_buf, tr) {
            (Some(b), Track::Write) => b.track_write(stream),
            (Some(b), Track::Read) => b.track_read(stream),
            _ => SyncOnDrop::Record(None),
        };
        [send, recv]
    }

    /// How [`Io::track`] treats the send-side and receive-side buffers when the call reads the
    /// input (`uses_send`) and writes the output (`uses_recv`). An in-place buffer is held on
    /// the receive side: written if the call writes the output (a write is also ordered after
    /// earlier reads), else only read.
    fn tracking_plan(&self, uses_send: bool, uses_recv: bool) -> (Track, Track) {
        let send = if self.send_buf.is_some() && uses_send {
            Track::Read
        } else {
            Track::None
        };
        let recv = match (
            self.recv_buf.is_some(),
            uses_recv,
            self.args.in_place && uses_send,
        ) {
            (true, true, _) => Track::Write,
            (true, false, true) => Track::Read,
            _ => Track::None,
        };
        (send, recv)
    }
}

/// What [`Io::track`] does with one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Track {
    None,
    Read,
    Write,
}

impl<T> std::fmt::Debug for Io<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("send", &self.args.send)
            .field("recv", &self.args.recv)
            .field("in_place", &self.args.in_place)
            .finish()
    }
}

/// One rank's arguments as plain data: what [`crate::api::validate`] checks.
///
/// ```
/// use ringccl::internals::api::buffer::RankArgs;
/// use ringccl::RawBuf;
/// let b = RawBuf::new(0x1000, 8, 0);
/// let a = RankArgs::in_place(b);
/// assert_eq!((a.send, a.recv, a.in_place), (Some(b), Some(b), true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankArgs {
    /// The input buffer, if given.
    pub send: Option<RawBuf>,
    /// The output buffer, if given.
    pub recv: Option<RawBuf>,
    /// One buffer used in place (then `send == recv`).
    pub in_place: bool,
}

impl RankArgs {
    /// As [`Io::in_place`].
    pub const fn in_place(buf: RawBuf) -> Self {
        Self {
            send: Some(buf),
            recv: Some(buf),
            in_place: true,
        }
    }
    /// As [`Io::out_of_place`].
    pub const fn out_of_place(send: RawBuf, recv: RawBuf) -> Self {
        Self {
            send: Some(send),
            recv: Some(recv),
            in_place: false,
        }
    }
    /// As [`Io::send_only`].
    pub const fn send_only(send: RawBuf) -> Self {
        Self {
            send: Some(send),
            recv: None,
            in_place: false,
        }
    }
    /// As [`Io::recv_only`].
    pub const fn recv_only(recv: RawBuf) -> Self {
        Self {
            send: None,
            recv: Some(recv),
            in_place: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake buffer: no GPU, no tracking.
    struct Fake(RawBuf);
    // SAFETY: never dereferenced; tests only look at the address.
    unsafe impl DeviceSlice<f32> for Fake {
        fn raw(&self) -> RawBuf {
            self.0
        }
    }
    // SAFETY: as above.
    unsafe impl DeviceSliceMut<f32> for Fake {}

    #[test]
    fn constructors_capture_raw_buffers() {
        let mut a = Fake(RawBuf::new(0x1000, 16, 2));
        let b = Fake(RawBuf::new(0x9000, 32, 2));
        {
            let io = Io::in_place(&mut a);
            assert!(io.is_in_place());
            assert_eq!(io.send(), Some(RawBuf::new(0x1000, 16, 2)));
            assert_eq!(io.recv(), io.send());
        }
        let a_raw = a.0;
        assert_eq!(
            Io::out_of_place(&b, &mut a).args(),
            RankArgs::out_of_place(b.0, a_raw)
        );
        assert_eq!(Io::send_only(&b).args(), RankArgs::send_only(b.0));
        assert_eq!(Io::recv_only(&mut a).args(), RankArgs::recv_only(a.0));
    }

    /// `track` needs a stream, which needs a GPU: check its decisions through `tracking_plan`.
    #[test]
    fn tracking_follows_what_the_call_uses() {
        let mut a = Fake(RawBuf::new(0x1000, 16, 0));
        let b = Fake(RawBuf::new(0x9000, 16, 0));
        // (send side, recv side) for (uses_send, uses_recv).
        let io = Io::in_place(&mut a);
        assert_eq!(io.tracking_plan(true, true), (Track::None, Track::Write));
        assert_eq!(io.tracking_plan(true, false), (Track::None, Track::Read));
        assert_eq!(io.tracking_plan(false, false), (Track::None, Track::None));
        let io = Io::out_of_place(&b, &mut a);
        assert_eq!(io.tracking_plan(true, true), (Track::Read, Track::Write));
        assert_eq!(io.tracking_plan(false, true), (Track::None, Track::Write));
        assert_eq!(io.tracking_plan(true, false), (Track::Read, Track::None));
        assert_eq!(
            Io::send_only(&b).tracking_plan(true, true),
            (Track::Read, Track::None)
        );
        assert_eq!(
            Io::recv_only(&mut a).tracking_plan(true, true),
            (Track::None, Track::Write)
        );
    }

    #[test]
    fn io_debug_shows_buffers() {
        let mut a = Fake(RawBuf::new(0xabc0, 4, 0));
        let s = format!("{:?}", Io::in_place(&mut a));
        assert!(s.contains("in_place: true") && s.contains("43968"), "{s}");
    }

    #[test]
    fn byte_end_and_offset() {
        let b = RawBuf::new(100, 10, 3);
        assert_eq!(b.byte_end(2), Some(120));
        assert_eq!(RawBuf::new(u64::MAX - 3, 1, 0).byte_end(8), None);
        assert_eq!(RawBuf::new(0, usize::MAX, 0).byte_end(2), None);
        assert_eq!(b.offset(3, 2), Some(RawBuf::new(106, 7, 3)));
        assert_eq!(b.offset(12, 2), Some(RawBuf::new(124, 0, 3)));
        assert_eq!(RawBuf::new(u64::MAX, 1, 0).offset(1, 1), None);
    }
}
