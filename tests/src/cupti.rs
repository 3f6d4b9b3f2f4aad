//! Every CUDA driver call a piece of code makes on the calling thread, counted by CUPTI's
//! callback API (`libcupti.so`, loaded at run time): the driver itself reports each call on
//! entry, so the count includes cudarc's calls and ringccl's alike, whatever library issued
//! them. Calls of other threads (a communicator's watchdog, the bootstrap) are not counted.
//!
//! ```no_run
//! use ringccl_tests::cupti::DriverCalls;
//! let cupti = DriverCalls::load()?;
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! let calls = cupti.count(|| {
//!     let _ = stream.alloc_zeros::<f32>(16);
//! });
//! println!("{calls:?}");
//! assert!(calls.matching("cuMemAlloc") + calls.matching("cuMemcpy") + calls.matching("cuMemset") > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// `CUPTI_CB_DOMAIN_DRIVER_API`.
const DOMAIN_DRIVER_API: u32 = 1;
/// `CUPTI_API_ENTER`.
const API_ENTER: u32 = 0;
/// Callback ids counted (the driver API's ids are below a thousand in CUDA 13).
const IDS: usize = 4096;

/// The leading fields of `CUpti_CallbackData` (`cupti_callbacks.h`) that the counter reads.
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const c_char,
}

static COUNTS: [AtomicU64; IDS] = [const { AtomicU64::new(0) }; IDS];
/// Each id's `functionName` (a global constant string of CUPTI, per its header), as an address.
static NAMES: [AtomicUsize; IDS] = [const { AtomicUsize::new(0) }; IDS];

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

/// The callback: counts a driver call on entry where the calling thread is counting. Never
/// panics (it is called from C).
extern "C" fn on_call(_user: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    if domain != DOMAIN_DRIVER_API || data.is_null() {
        return;
    }
    if !COUNTING.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    // SAFETY: for the driver domain CUPTI passes a `CUpti_CallbackData`, whose first two
    // fields these are.
    let d = unsafe { &*(data as *const CallbackData) };
    if d.callback_site != API_ENTER {
        return;
    }
    let i = (cbid as usize).min(IDS - 1);
    COUNTS[i].fetch_add(1, Relaxed);
    if NAMES[i].load(Relaxed) == 0 {
        NAMES[i].store(d.function_name as usize, Relaxed);
    }
}

type Subscribe = unsafe extern "C" fn(
    *mut *mut c_void,
    extern "C" fn(*mut c_void, u32, u32, *const c_void),
    *mut c_void,
) -> i32;
type EnableDomain = unsafe extern "C" fn(u32, *mut c_void, u32) -> i32;
type Unsubscribe = unsafe extern "C" fn(*mut c_void) -> i32;

/// CUPTI, loaded and subscribed to the driver API's callbacks (one subscriber per process:
/// make one [`DriverCalls`] and count with it).
///
/// Dropping it ends the subscription but leaves CUPTI loaded for the rest of the process: CUPTI
/// stays attached to the driver once loaded (its exit handlers and the driver's hooks into it
/// outlive the subscription), and unloading it made a rank's process end in SIGSEGV after its
/// last test had passed (one H200, two processes under MPS).
pub struct DriverCalls {
    subscriber: *mut c_void,
    unsubscribe: Unsubscribe,
    _lib: std::mem::ManuallyDrop<libloading::Library>,
}

/// Driver calls by function name (`cuLaunchKernel`, `cuEventRecord`, …) and how many times
/// each was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls(pub BTreeMap<String, u64>);

impl Calls {
    /// Calls of the functions whose names start with `prefix` (`"cuMemcpy"` counts every
    /// variant of copy).
    pub fn matching(&self, prefix: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    }

    /// Every call counted.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The counts as `name ×count` pairs, `per` calls of the code counted as one (a count that
    /// does not divide is shown as a fraction).
    pub fn per(&self, per: u64) -> String {
        let per = per.max(1);
        self.0
            .iter()
            .map(|(k, v)| {
                if v % per == 0 {
                    format!("{k} x{}", v / per)
                } else {
                    format!("{k} x{v}/{per}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where CUPTI may be, in order: `RINGCCL_TEST_CUPTI`, then the loader's search path, then every
/// `libcupti.so*` in the CUDA toolkit's usual directories.
const NAMES_ON_PATH: [&str; 3] = ["libcupti.so", "libcupti.so.13", "libcupti.so.12"];
const TOOLKIT_DIRS: [&str; 4] = [
    "/usr/local/cuda/extras/CUPTI/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda-13.0/extras/CUPTI/lib64",
    "/usr/local/cuda-13.0/targets/x86_64-linux/lib",
];

/// The candidates of [`DriverCalls::load`], in order.
fn candidates() -> Vec<String> {
    let mut out: Vec<String> = std::env::var("RINGCCL_TEST_CUPTI").into_iter().collect();
    out.extend(NAMES_ON_PATH.iter().map(|s| s.to_string()));
    for dir in TOOLKIT_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path().to_string_lossy().into_owned())
            .filter(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("libcupti.so"))
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}

impl DriverCalls {
    /// Loads CUPTI and subscribes to the driver API's callbacks; an error names what failed
    /// (set `RINGCCL_TEST_CUPTI` to the library's path where it is elsewhere).
    pub fn load() -> Result<DriverCalls, String> {
        let mut tried = Vec::new();
        let lib = candidates()
            .iter()
            .find_map(|path| {
                // SAFETY: loading CUPTI runs its initialisers, which only register with the
                // driver.
                match unsafe { libloading::Library::new(path) } {
                    Ok(lib) => Some(lib),
                    Err(e) => {
                        tried.push(format!("{path}: {e}"));
                        None
                    }
                }
            })
            .ok_or_else(|| format!("CUPTI not found ({})", tried.join("; ")))?;
        // SAFETY: the symbols have these C signatures (`cupti_callbacks.h`).
        let (subscribe, enable, unsubscribe) = unsafe {
            let s = *lib
                .get::<Subscribe>(b"cuptiSubscribe\0")
                .map_err(|e| e.to_string())?;
            let e = *lib
                .get::<EnableDomain>(b"cuptiEnableDomain\0")
                .map_err(|e| e.to_string())?;
            let u = *lib
                .get::<Unsubscribe>(b"cuptiUnsubscribe\0")
                .map_err(|e| e.to_string())?;
            (s, e, u)
        };
        let mut subscriber = std::ptr::null_mut();
        // SAFETY: `subscriber` is written by the call; the callback lives for the process.
        let r = unsafe { subscribe(&mut subscriber, on_call, std::ptr::null_mut()) };
        if r != 0 {
            return Err(format!("cuptiSubscribe failed: CUPTI error {r}"));
        }
        // SAFETY: `subscriber` is the live subscription made above.
        let r = unsafe { enable(1, subscriber, DOMAIN_DRIVER_API) };
        if r != 0 {
            // SAFETY: as above.
            unsafe { unsubscribe(subscriber) };
            return Err(format!("cuptiEnableDomain failed: CUPTI error {r}"));
        }
        Ok(DriverCalls {
            subscriber,
            unsubscribe,
            _lib: std::mem::ManuallyDrop::new(lib),
        })
    }

    /// Runs `f` and returns the driver calls it made on this thread.
    pub fn count(&self, f: impl FnOnce()) -> Calls {
        let before: Vec<u64> = COUNTS.iter().map(|c| c.load(Relaxed)).collect();
        COUNTING.with(|c| c.set(true));
        f();
        COUNTING.with(|c| c.set(false));
        let mut calls = BTreeMap::new();
        for (i, c) in COUNTS.iter().enumerate() {
            let spent = c.load(Relaxed).wrapping_sub(before[i]);
            if spent == 0 {
                continue;
            }
            let name = match NAMES[i].load(Relaxed) {
                0 => format!("callback {i}"),
                // SAFETY: CUPTI's function names are global constant C strings.
                p => unsafe { CStr::from_ptr(p as *const c_char) }
                    .to_string_lossy()
                    .into_owned(),
            };
            *calls.entry(name).or_insert(0) += spent;
        }
        Calls(calls)
    }
}

impl Drop for DriverCalls {
    fn drop(&mut self) {
        // SAFETY: the subscription made by `load`, ended once.
        unsafe { (self.unsubscribe)(self.subscriber) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_by_prefix() {
        let c = Calls(BTreeMap::from([
            ("cuMemcpyDtoDAsync_v2".to_string(), 4),
            ("cuMemcpyHtoD_v2".to_string(), 2),
            ("cuLaunchKernel".to_string(), 8),
        ]));
        assert_eq!(c.matching("cuMemcpy"), 6);
        assert_eq!(c.matching("cuLaunch"), 8);
        assert_eq!(c.matching("cuEvent"), 0);
        assert_eq!(c.total(), 14);
        assert_eq!(
            c.per(2),
            "cuLaunchKernel x4, cuMemcpyDtoDAsync_v2 x2, cuMemcpyHtoD_v2 x1"
        );
        assert_eq!(c.per(4).split(", ").last(), Some("cuMemcpyHtoD_v2 x2/4"));
    }

    #[test]
    fn nothing_is_counted_on_a_thread_that_is_not_counting() {
        // The callback as CUPTI would call it, on a thread that is not counting.
        let name = c"cuLaunchKernel";
        let data = CallbackData {
            callback_site: API_ENTER,
            function_name: name.as_ptr(),
        };
        let id = IDS - 2;
        let before = COUNTS[id].load(Relaxed);
        on_call(
            std::ptr::null_mut(),
            DOMAIN_DRIVER_API,
            id as u32,
            &data as *const CallbackData as *const c_void,
        );
        assert_eq!(COUNTS[id].load(Relaxed), before);
        // And on one that is.
        COUNTING.with(|c| c.set(true));
        on_call(
            std::ptr::null_mut(),
            DOMAIN_DRIVER_API,
            id as u32,
            &data as *const CallbackData as *const c_void,
        );
        // The exit of the same call is not counted again.
        let exit = CallbackData {
            callback_site: 1,
            function_name: name.as_ptr(),
        };
        on_call(
            std::ptr::null_mut(),
            DOMAIN_DRIVER_API,
            id as u32,
            &exit as *const CallbackData as *const c_void,
        );
        COUNTING.with(|c| c.set(false));
        assert_eq!(COUNTS[id].load(Relaxed), before + 1);
        assert_eq!(NAMES[id].load(Relaxed), name.as_ptr() as usize);
    }
}
