//! A thin binding of the UCP API (UCX's protocol layer): the few calls the network proxy needs,
//! loaded from `libucp.so.0` at run time, so that building ringccl needs no UCX and a user picks
//! the UCX build (the system's, a PyPI wheel's, a site's) with the library search path.
//!
//! Structures are written from UCX 1.13's `ucp/api/ucp.h` (the oldest UCX this targets; newer
//! releases only append fields, each guarded by a `field_mask` bit this code leaves clear), and
//! their sizes and offsets were checked against that header with `offsetof`; the tests below keep
//! the sizes. Every call goes through a safe wrapper that turns a `ucs_status_t` into an
//! [`Error::Network`] with UCX's own text (`ucs_status_string`).
//!
//! Ownership: a [`Context`] (`ucp_context_h`) outlives its [`Worker`]s (each holds an `Arc` of
//! it); a worker owns its endpoints and its requests ([`ReqId`]), and releases both before it is
//! destroyed. Only the endpoints' error handler is called by UCX (it stores a status into an
//! atomic: nothing that can panic crosses the C boundary); sends and receives are polled,
//! without callbacks.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// `ucs_status_t`: 0 is `UCS_OK`, 1 `UCS_INPROGRESS`, negative values are errors.
pub type Status = i32;
/// `UCS_OK`.
pub const UCS_OK: Status = 0;
/// `UCS_INPROGRESS`.
pub const UCS_INPROGRESS: Status = 1;
/// `UCS_ERR_LAST`: a `ucs_status_ptr_t` at or above this (as an unsigned pointer) is an error.
const UCS_ERR_LAST: isize = -100;

const UCP_API_MAJOR: c_uint = 1;
const UCP_API_MINOR: c_uint = 13;

const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
const UCP_FEATURE_TAG: u64 = 1 << 0;
const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
const UCS_THREAD_MODE_SINGLE: c_int = 0;
const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

/// `ucp_params_t` (80 bytes in UCX 1.13).
#[repr(C)]
struct UcpParams {
    field_mask: u64,
    features: u64,
    request_size: usize,
    request_init: *const c_void,
    request_cleanup: *const c_void,
    tag_sender_mask: u64,
    mt_workers_shared: c_int,
    estimated_num_eps: usize,
    estimated_num_ppn: usize,
    name: *const c_char,
}

/// `ucp_worker_params_t` (200 bytes in UCX 1.13).
#[repr(C)]
struct WorkerParams {
    field_mask: u64,
    thread_mode: c_int,
    cpu_mask: [u64; 16],
    events: c_uint,
    user_data: *mut c_void,
    event_fd: c_int,
    flags: u64,
    name: *const c_char,
    am_alignment: usize,
    client_id: u64,
}

/// `ucs_sock_addr_t`.
#[repr(C)]
struct SockAddr {
    addr: *const c_void,
    addrlen: u32,
}

/// `ucp_err_handler_t`.
#[repr(C)]
struct ErrHandler {
    cb: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, Status)>,
    arg: *mut c_void,
}

/// `ucp_ep_params_t` (104 bytes in UCX 1.13).
#[repr(C)]
struct EpParams {
    field_mask: u64,
    address: *const c_void,
    err_mode: c_int,
    err_handler: ErrHandler,
    user_data: *mut c_void,
    flags: c_uint,
    sockaddr: SockAddr,
    conn_request: *mut c_void,
    name: *const c_char,
    local_sockaddr: SockAddr,
}

/// `ucp_request_param_t` (72 bytes in UCX 1.13).
#[repr(C)]
struct RequestParam {
    op_attr_mask: u32,
    flags: u32,
    request: *mut c_void,
    cb: *const c_void,
    datatype: u64,
    user_data: *mut c_void,
    reply_buffer: *mut c_void,
    memory_type: c_int,
    recv_info: *mut c_void,
    memh: *mut c_void,
}

impl RequestParam {
    fn none() -> RequestParam {
        RequestParam {
            op_attr_mask: 0,
            flags: 0,
            request: std::ptr::null_mut(),
            cb: std::ptr::null(),
            datatype: 0,
            user_data: std::ptr::null_mut(),
            reply_buffer: std::ptr::null_mut(),
            memory_type: 0,
            recv_info: std::ptr::null_mut(),
            memh: std::ptr::null_mut(),
        }
    }
}

/// `ucp_tag_recv_info_t`.
#[repr(C)]
struct TagRecvInfo {
    sender_tag: u64,
    length: usize,
}

type Handle = *mut c_void;

/// The UCP entry points, resolved once from `libucp.so.0`.
struct Fns {
    config_read: unsafe extern "C" fn(*const c_char, *const c_char, *mut Handle) -> Status,
    config_release: unsafe extern "C" fn(Handle),
    config_modify: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> Status,
    init_version: unsafe extern "C" fn(c_uint, c_uint, *const UcpParams, Handle, *mut Handle) -> Status,
    cleanup: unsafe extern "C" fn(Handle),
    worker_create: unsafe extern "C" fn(Handle, *const WorkerParams, *mut Handle) -> Status,
    worker_destroy: unsafe extern "C" fn(Handle),
    worker_get_address: unsafe extern "C" fn(Handle, *mut Handle, *mut usize) -> Status,
    worker_release_address: unsafe extern "C" fn(Handle, Handle),
    worker_progress: unsafe extern "C" fn(Handle) -> c_uint,
    ep_create: unsafe extern "C" fn(Handle, *const EpParams, *mut Handle) -> Status,
    ep_close_nbx: unsafe extern "C" fn(Handle, *const RequestParam) -> Handle,
    tag_send_nbx: unsafe extern "C" fn(Handle, *const c_void, usize, u64, *const RequestParam) -> Handle,
    tag_recv_nbx: unsafe extern "C" fn(Handle, *mut c_void, usize, u64, u64, *const RequestParam) -> Handle,
    tag_recv_request_test: unsafe extern "C" fn(Handle, *mut TagRecvInfo) -> Status,
    request_check_status: unsafe extern "C" fn(Handle) -> Status,
    request_cancel: unsafe extern "C" fn(Handle, Handle),
    request_free: unsafe extern "C" fn(Handle),
    status_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
}

/// The loaded UCP library.
pub struct Ucp {
    fns: Fns,
    /// The library stays loaded while any handle made from it lives.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Ucp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ucp({})", self.version())
    }
}

/// The shared libraries tried, in order (the first found on the library search path wins).
const LIBRARIES: [&str; 2] = ["libucp.so.0", "libucp.so"];

fn net_error(reason: String) -> Error {
    Error::Network {
        rank: None,
        peer: None,
        reason,
    }
}

impl Ucp {
    /// Loads UCP once per process (later calls share it, or repeat the first failure).
    ///
    /// Errors with [`Error::Network`] naming the libraries tried when none loads.
    ///
    /// ```no_run
    /// use ringccl::internals::transport::net::ucp::Ucp;
    /// let ucp = Ucp::load()?;
    /// println!("UCX {}", ucp.version());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn load() -> Result<Arc<Ucp>> {
        static LOADED: OnceLock<std::result::Result<Arc<Ucp>, String>> = OnceLock::new();
        LOADED
            .get_or_init(|| Ucp::open().map(Arc::new))
            .clone()
            .map_err(net_error)
    }

    fn open() -> std::result::Result<Ucp, String> {
        Ucp::open_from(&LIBRARIES)
    }

    fn open_from(names: &[&str]) -> std::result::Result<Ucp, String> {
        let mut tried = Vec::new();
        for &name in names {
            // SAFETY: loading UCP runs its initialisers, which only set up UCX's own state.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Ucp::resolve(lib).map_err(|e| format!("{name}: {e}")),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "the UCX library (libucp) was not found ({}): install UCX (Debian/Ubuntu: apt install \
             libucx0; or a build with CUDA, e.g. the PyPI wheel libucx-cu12) and put its lib \
             directory on LD_LIBRARY_PATH",
            tried.join("; ")
        ))
    }

    fn resolve(lib: libloading::Library) -> std::result::Result<Ucp, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is declared above with its C signature from UCX 1.13's
                // headers; the pointer is used only while `lib` is loaded (kept in `Ucp`).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("symbol {}: {e}", $name))?
            };
        }
        let fns = Fns {
            config_read: sym!("ucp_config_read"),
            config_release: sym!("ucp_config_release"),
            config_modify: sym!("ucp_config_modify"),
            init_version: sym!("ucp_init_version"),
            cleanup: sym!("ucp_cleanup"),
            worker_create: sym!("ucp_worker_create"),
            worker_destroy: sym!("ucp_worker_destroy"),
            worker_get_address: sym!("ucp_worker_get_address"),
            worker_release_address: sym!("ucp_worker_release_address"),
            worker_progress: sym!("ucp_worker_progress"),
            ep_create: sym!("ucp_ep_create"),
            ep_close_nbx: sym!("ucp_ep_close_nbx"),
            tag_send_nbx: sym!("ucp_tag_send_nbx"),
            tag_recv_nbx: sym!("ucp_tag_recv_nbx"),
            tag_recv_request_test: sym!("ucp_tag_recv_request_test"),
            request_check_status: sym!("ucp_request_check_status"),
            request_cancel: sym!("ucp_request_cancel"),
            request_free: sym!("ucp_request_free"),
            status_string: sym!("ucs_status_string"),
            get_version: sym!("ucp_get_version"),
        };
        Ok(Ucp { fns, _lib: lib })
    }

    /// The loaded library's version, `major.minor.release`.
    pub fn version(&self) -> String {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: the three pointers are valid for writes.
        unsafe { (self.fns.get_version)(&mut a, &mut b, &mut c) };
        format!("{a}.{b}.{c}")
    }

    /// UCX's text for `status`.
    pub fn status_text(&self, status: Status) -> String {
        // SAFETY: `ucs_status_string` returns a static NUL-terminated string for any value.
        let p = unsafe { (self.fns.status_string)(status) };
        if p.is_null() {
            return format!("UCX status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static (checked above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &str, status: Status) -> Result<()> {
        if status == UCS_OK {
            Ok(())
        } else {
            Err(net_error(format!("{call} failed: {}", self.status_text(status))))
        }
    }
}

/// A UCP context (`ucp_context_h`) with tag matching, configured from the `UCX_*` environment
/// variables (`UCX_TLS`, `UCX_NET_DEVICES`, ...).
pub struct Context {
    ucp: Arc<Ucp>,
    h: Handle,
}

// SAFETY: a UCP context is not tied to the thread that created it.
unsafe impl Send for Context {}
// SAFETY: the only shared-reference use is creating workers, which may run concurrently: the
// context is created with `mt_workers_shared = 1`, so UCX locks the context's shared state.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// Reads the UCX configuration from the environment, sets `overrides` (UCX names without
    /// the `UCX_` prefix, e.g. `("TLS", "tcp")`) over it, and initialises a context.
    ///
    /// ```no_run
    /// use ringccl::internals::transport::net::ucp::{Context, Ucp};
    /// let ctx = Context::new(Ucp::load()?, &[("TLS", "tcp"), ("NET_DEVICES", "lo")])?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new(ucp: Arc<Ucp>, overrides: &[(&str, &str)]) -> Result<Arc<Context>> {
        let mut config: Handle = std::ptr::null_mut();
        // SAFETY: null prefix and file name ask for the defaults; `config` is valid for a write.
        let st = unsafe { (ucp.fns.config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        ucp.check("ucp_config_read", st)?;
        for (name, value) in overrides {
            let c = |s: &str| {
                std::ffi::CString::new(s).map_err(|_| net_error(format!("UCX setting {s:?}")))
            };
            let set = c(name).and_then(|n| {
                let v = c(value)?;
                // SAFETY: a live configuration and two NUL-terminated strings.
                let st = unsafe { (ucp.fns.config_modify)(config, n.as_ptr(), v.as_ptr()) };
                ucp.check(&format!("ucp_config_modify({name}={value})"), st)
            });
            if let Err(e) = set {
                // SAFETY: released once, on this error path.
                unsafe { (ucp.fns.config_release)(config) };
                return Err(e);
            }
        }
        let params = UcpParams {
            field_mask: UCP_PARAM_FIELD_FEATURES
                | UCP_PARAM_FIELD_MT_WORKERS_SHARED
                | UCP_PARAM_FIELD_NAME,
            features: UCP_FEATURE_TAG,
            request_size: 0,
            request_init: std::ptr::null(),
            request_cleanup: std::ptr::null(),
            tag_sender_mask: 0,
            mt_workers_shared: 1,
            estimated_num_eps: 0,
            estimated_num_ppn: 0,
            name: c"ringccl".as_ptr(),
        };
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `params` is a valid `ucp_params_t` whose masked fields are set; `config` came
        // from `ucp_config_read`; `h` is valid for a write.
        let st = unsafe {
            (ucp.fns.init_version)(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &mut h)
        };
        // SAFETY: `config` is released once, after its last use.
        unsafe { (ucp.fns.config_release)(config) };
        ucp.check("ucp_init", st)?;
        Ok(Arc::new(Context { ucp, h }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker holds an `Arc` of this context, so none is left.
        unsafe { (self.ucp.fns.cleanup)(self.h) };
    }
}

/// An endpoint of a worker and the status its error handler stored (0 while healthy).
struct Endpoint {
    h: Handle,
    /// Written by UCX's error-handler callback; boxed so that its address is stable.
    error: Box<AtomicI32>,
}

/// The error handler given to UCX: records the status. It cannot panic.
unsafe extern "C" fn on_endpoint_error(arg: *mut c_void, _ep: *mut c_void, status: Status) {
    if !arg.is_null() {
        // SAFETY: `arg` is the `Box<AtomicI32>` of the endpoint, alive until the endpoint is
        // closed (the worker drops the box only after `ucp_ep_close_nbx`).
        let cell = unsafe { &*(arg as *const AtomicI32) };
        cell.store(if status == UCS_OK { -1 } else { status }, Ordering::Release);
    }
}

/// A UCP worker (`ucp_worker_h`, single-threaded mode) and its endpoints. Used by one thread at a
/// time (it is `Send`, not `Sync`; its requests never leave it).
pub struct Worker {
    ctx: Arc<Context>,
    h: Handle,
    eps: Vec<Endpoint>,
    /// Requests in flight (a slab: `None` is free).
    reqs: Vec<Option<Req>>,
}

// SAFETY: a worker in `UCS_THREAD_MODE_SINGLE` may move between threads as long as one thread at
// a time uses it, which `&mut`/ownership and the missing `Sync` enforce.
unsafe impl Send for Worker {}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("endpoints", &self.eps.len())
            .finish_non_exhaustive()
    }
}

/// An index into a worker's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpId(usize);

/// An operation in flight on a worker, polled with [`Worker::poll`]. Its request lives in the
/// worker (so that no request outlives its worker or is touched from another thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReqId(usize);

/// A started operation: done already, or in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// Completed immediately.
    Done,
    /// In flight.
    Pending(ReqId),
}

/// Whether a request is a receive (its length is read when it completes).
#[derive(Clone, Copy, Debug)]
struct Req {
    h: Handle,
    recv: bool,
}

impl Worker {
    /// Creates a worker of `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Worker> {
        let params = WorkerParams {
            field_mask: UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            thread_mode: UCS_THREAD_MODE_SINGLE,
            cpu_mask: [0; 16],
            events: 0,
            user_data: std::ptr::null_mut(),
            event_fd: 0,
            flags: 0,
            name: std::ptr::null(),
            am_alignment: 0,
            client_id: 0,
        };
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: valid params (masked fields set), live context, `h` valid for a write.
        let st = unsafe { (ctx.ucp.fns.worker_create)(ctx.h, &params, &mut h) };
        ctx.ucp.check("ucp_worker_create", st)?;
        Ok(Worker {
            ctx: ctx.clone(),
            h,
            eps: Vec::new(),
            reqs: Vec::new(),
        })
    }

    fn ucp(&self) -> &Ucp {
        &self.ctx.ucp
    }

    /// This worker's address, to give to the peers that connect to it.
    pub fn address(&self) -> Result<Vec<u8>> {
        let (mut addr, mut len): (Handle, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: live worker; both out-pointers valid for writes.
        let st = unsafe { (self.ucp().fns.worker_get_address)(self.h, &mut addr, &mut len) };
        self.ucp().check("ucp_worker_get_address", st)?;
        // SAFETY: UCX returned `len` readable bytes at `addr`.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: released once, after the copy.
        unsafe { (self.ucp().fns.worker_release_address)(self.h, addr) };
        Ok(bytes)
    }

    /// Connects to the worker whose [`Worker::address`] is `address`, with peer failure
    /// detection (a lost peer fails the endpoint's operations and sets [`Worker::ep_error`]).
    ///
    /// # Safety
    /// `address` must be an address returned by [`Worker::address`] of some worker (UCX parses
    /// it without bounds checks). The caller checks its framing and length before this.
    pub unsafe fn connect(&mut self, address: &[u8]) -> Result<EpId> {
        let error = Box::new(AtomicI32::new(0));
        let params = EpParams {
            field_mask: UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | UCP_EP_PARAM_FIELD_ERR_HANDLER,
            address: address.as_ptr() as *const c_void,
            err_mode: UCP_ERR_HANDLING_MODE_PEER,
            err_handler: ErrHandler {
                cb: Some(on_endpoint_error),
                arg: &*error as *const AtomicI32 as *mut c_void,
            },
            user_data: std::ptr::null_mut(),
            flags: 0,
            sockaddr: SockAddr {
                addr: std::ptr::null(),
                addrlen: 0,
            },
            conn_request: std::ptr::null_mut(),
            name: std::ptr::null(),
            local_sockaddr: SockAddr {
                addr: std::ptr::null(),
                addrlen: 0,
            },
        };
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: valid params; the address is valid per this function's contract; the error
        // cell outlives the endpoint (both live in `self.eps` until `Drop` closes the endpoint).
        let st = unsafe { (self.ucp().fns.ep_create)(self.h, &params, &mut h) };
        self.ucp().check("ucp_ep_create", st)?;
        self.eps.push(Endpoint { h, error });
        Ok(EpId(self.eps.len() - 1))
    }

    /// The status UCX's error handler stored for `ep` (`None` while healthy).
    pub fn ep_error(&self, ep: EpId) -> Option<String> {
        let st = self.eps.get(ep.0)?.error.load(Ordering::Acquire);
        (st != 0).then(|| self.ucp().status_text(st))
    }

    /// Progresses communication; returns whether anything happened.
    pub fn progress(&mut self) -> bool {
        // SAFETY: live worker, used by this thread only (`&mut self`).
        unsafe { (self.ucp().fns.worker_progress)(self.h) > 0 }
    }

    fn started(&mut self, call: &str, p: Handle, recv: bool) -> Result<Started> {
        if p.is_null() {
            return Ok(Started::Done);
        }
        if p as isize as usize >= UCS_ERR_LAST as usize {
            return Err(net_error(format!(
                "{call} failed: {}",
                self.ucp().status_text(p as isize as Status)
            )));
        }
        let req = Some(Req { h: p, recv });
        let id = match self.reqs.iter().position(Option::is_none) {
            Some(i) => {
                self.reqs[i] = req;
                i
            }
            None => {
                self.reqs.push(req);
                self.reqs.len() - 1
            }
        };
        Ok(Started::Pending(ReqId(id)))
    }

    /// Starts sending `len` bytes at `buf` with `tag` on `ep`.
    ///
    /// # Safety
    /// The bytes must stay readable and unchanged until the operation completes ([`Started::Done`]
    /// or [`Worker::test`] returned `true`), or the worker is dropped.
    pub unsafe fn send(&mut self, ep: EpId, buf: *const u8, len: usize, tag: u64) -> Result<Started> {
        let ep = self
            .eps
            .get(ep.0)
            .ok_or_else(|| net_error(format!("no endpoint {}", ep.0)))?
            .h;
        let param = RequestParam::none();
        // SAFETY: live endpoint of this worker; the buffer per this function's contract.
        let p = unsafe { (self.ucp().fns.tag_send_nbx)(ep, buf as *const c_void, len, tag, &param) };
        self.started("ucp_tag_send_nbx", p, false)
    }

    /// Starts receiving a message whose tag matches `tag` under `mask` into `len` bytes at `buf`.
    ///
    /// # Safety
    /// The bytes must stay writable, and be neither read nor written by anyone else, until the
    /// operation completes or the worker is dropped.
    pub unsafe fn recv(&mut self, buf: *mut u8, len: usize, tag: u64, mask: u64) -> Result<Started> {
        let param = RequestParam::none();
        // SAFETY: live worker; the buffer per this function's contract.
        let p = unsafe { (self.ucp().fns.tag_recv_nbx)(self.h, buf as *mut c_void, len, tag, mask, &param) };
        self.started("ucp_tag_recv_nbx", p, true)
    }

    /// Polls `id`: `None` while in flight; when complete, the bytes received (0 for a send),
    /// or the error it completed with. A complete request is freed, and `id` becomes invalid.
    pub fn poll(&mut self, id: ReqId) -> Result<Option<usize>> {
        let req = self
            .reqs
            .get(id.0)
            .copied()
            .flatten()
            .ok_or_else(|| net_error(format!("no request {}", id.0)))?;
        let mut info = TagRecvInfo {
            sender_tag: 0,
            length: 0,
        };
        let st = if req.recv {
            // SAFETY: a live receive request of this worker; `info` valid for a write.
            unsafe { (self.ucp().fns.tag_recv_request_test)(req.h, &mut info) }
        } else {
            // SAFETY: a live request of this worker.
            unsafe { (self.ucp().fns.request_check_status)(req.h) }
        };
        if st == UCS_INPROGRESS {
            return Ok(None);
        }
        // SAFETY: complete, freed once; the slot is cleared with it.
        unsafe { (self.ucp().fns.request_free)(req.h) };
        self.reqs[id.0] = None;
        self.ucp().check("a UCX request", st)?;
        Ok(Some(info.length))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        for req in self.reqs.drain(..).flatten() {
            // SAFETY: live requests of this worker, cancelled and released once; UCX completes
            // them while the worker is destroyed below.
            unsafe {
                (self.ctx.ucp.fns.request_cancel)(self.h, req.h);
                (self.ctx.ucp.fns.request_free)(req.h);
            }
        }
        let mut closing = Vec::new();
        for ep in &self.eps {
            let mut param = RequestParam::none();
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            // SAFETY: each endpoint is closed once.
            let p = unsafe { (self.ucp().fns.ep_close_nbx)(ep.h, &param) };
            if !p.is_null() && (p as isize as usize) < UCS_ERR_LAST as usize {
                closing.push(p);
            }
        }
        // A forced close finishes locally; progress it for at most a second.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !closing.is_empty() && Instant::now() < deadline {
            // SAFETY: live worker.
            unsafe { (self.ucp().fns.worker_progress)(self.h) };
            closing.retain(|&p| {
                // SAFETY: a live close request.
                let done = unsafe { (self.ucp().fns.request_check_status)(p) } != UCS_INPROGRESS;
                if done {
                    // SAFETY: freed once, when complete.
                    unsafe { (self.ucp().fns.request_free)(p) };
                }
                !done
            });
        }
        for p in closing {
            // SAFETY: released to complete within the worker's destruction.
            unsafe { (self.ucp().fns.request_free)(p) };
        }
        // SAFETY: every endpoint is closed and every request released; destroyed once.
        unsafe { (self.ucp().fns.worker_destroy)(self.h) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = Ucp::open_from(&["libucp-not-here.so.0"]).expect_err("no such library");
        assert!(e.starts_with("the UCX library (libucp) was not found (libucp-not-here.so.0: "), "{e}");
        assert!(e.contains("LD_LIBRARY_PATH"), "{e}");
    }

    #[test]
    fn structures_match_ucx_1_13() {
        // Sizes measured with `sizeof` against UCX 1.13.1's headers (x86-64).
        assert_eq!(std::mem::size_of::<UcpParams>(), 80);
        assert_eq!(std::mem::size_of::<WorkerParams>(), 200);
        assert_eq!(std::mem::size_of::<EpParams>(), 104);
        assert_eq!(std::mem::size_of::<RequestParam>(), 72);
        assert_eq!(std::mem::offset_of!(WorkerParams, events), 144);
        assert_eq!(std::mem::offset_of!(WorkerParams, client_id), 192);
        assert_eq!(std::mem::offset_of!(EpParams, err_handler), 24);
        assert_eq!(std::mem::offset_of!(EpParams, local_sockaddr), 88);
        assert_eq!(std::mem::offset_of!(RequestParam, recv_info), 56);
        assert_eq!(std::mem::offset_of!(UcpParams, name), 72);
    }
}
