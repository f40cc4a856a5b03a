//! The C API: ARMCI's functions under their own names (`include/armci.h`), over one [`Armci`]
//! per process.
//!
//! Every export catches panics, checks its pointers and lengths before it makes a slice of them,
//! and reports a failure as ARMCI does: a negative return for the calls that return `int`
//! (`nicbar_armci_last_error()` says what went wrong), and for the `void` calls (fence, barrier,
//! lock) a message on stderr and the end of the process with status 1 — ARMCI's own `armci_die`.
#![allow(
    unsafe_code,
    reason = "the C API takes pointers from C: this module checks them and makes the slices"
)]

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_long, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

use crate::{Armci, ArmciError, Rmw, Scale};

/// ARMCI_Rmw's operation codes (as ARMCI numbers them).
const FETCH_AND_ADD: c_int = 88;
const FETCH_AND_ADD_LONG: c_int = 89;
const SWAP: c_int = 90;
const SWAP_LONG: c_int = 91;
/// ARMCI_Acc's type codes.
const ACC_INT: c_int = 101;
const ACC_DBL: c_int = 102;
const ACC_FLT: c_int = 103;
const ACC_LNG: c_int = 106;

/// The process's ARMCI, between ARMCI_Init and ARMCI_Finalize.
static STATE: Mutex<Option<Armci>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(error: &str) {
    let text = CString::new(error.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Runs `body` on the process's ARMCI; a failure becomes its negative code.
fn with_armci(name: &str, body: impl FnOnce(&mut Armci) -> Result<c_int, ArmciError>) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        match state.as_mut() {
            Some(armci) => body(armci),
            None => Err(ArmciError::Invalid(
                "ARMCI_Init has not been called".to_owned(),
            )),
        }
    }));
    match outcome {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => {
            remember(&format!("{name}: {error}"));
            error.code()
        }
        Err(_) => {
            remember(&format!("{name}: an internal error (a panic) was caught"));
            -8
        }
    }
}

/// As [`with_armci`], for the calls that return nothing: a failure ends the process.
fn or_die(name: &str, body: impl FnOnce(&mut Armci) -> Result<(), ArmciError>) {
    if with_armci(name, |armci| body(armci).map(|()| 0)) < 0 {
        let message = LAST_ERROR.with(|last| last.borrow().to_string_lossy().into_owned());
        eprintln!("{message}");
        std::process::exit(1);
    }
}

fn rank(proc: c_int) -> Result<usize, ArmciError> {
    usize::try_from(proc).map_err(|_| ArmciError::Invalid(format!("rank {proc}")))
}

fn length(bytes: c_int) -> Result<usize, ArmciError> {
    usize::try_from(bytes).map_err(|_| ArmciError::Invalid(format!("a length of {bytes} bytes")))
}

/// `len` bytes at `pointer` as a slice.
///
/// # Safety
/// `pointer` must be readable for `len` bytes (the caller's C contract).
unsafe fn bytes<'a>(pointer: *const c_void, len: usize) -> Result<&'a [u8], ArmciError> {
    if len == 0 {
        return Ok(&[]);
    }
    if pointer.is_null() {
        return Err(ArmciError::Invalid("a NULL buffer".to_owned()));
    }
    // SAFETY: not NULL, and the caller promises `len` readable bytes there.
    Ok(unsafe { std::slice::from_raw_parts(pointer.cast::<u8>(), len) })
}

/// `len` bytes at `pointer` as a mutable slice.
///
/// # Safety
/// `pointer` must be writable for `len` bytes and not otherwise in use during the call.
unsafe fn bytes_mut<'a>(pointer: *mut c_void, len: usize) -> Result<&'a mut [u8], ArmciError> {
    if len == 0 {
        return Ok(&mut []);
    }
    if pointer.is_null() {
        return Err(ArmciError::Invalid("a NULL buffer".to_owned()));
    }
    // SAFETY: not NULL, and the caller promises `len` writable bytes there, for this call alone.
    Ok(unsafe { std::slice::from_raw_parts_mut(pointer.cast::<u8>(), len) })
}

/// Starts ARMCI in this process (collective): the rank, its port and its peers from the
/// environment. Returns 0, or a negative code.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Init() -> c_int {
    let outcome = catch_unwind(|| {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        if state.is_none() {
            *state = Some(Armci::init()?);
        }
        Ok::<c_int, ArmciError>(0)
    });
    match outcome {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => {
            remember(&format!("ARMCI_Init: {error}"));
            error.code()
        }
        Err(_) => {
            remember("ARMCI_Init: an internal error (a panic) was caught");
            -8
        }
    }
}

/// Ends ARMCI in this process (collective): every put complete, a barrier, the port closed.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Finalize() {
    let armci = STATE.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(armci) = armci
        && let Err(error) = catch_unwind(AssertUnwindSafe(|| armci.finalize()))
            .unwrap_or_else(|_| Err(ArmciError::Invalid("a panic was caught".to_owned())))
    {
        eprintln!("ARMCI_Finalize: {error}");
        std::process::exit(1);
    }
}

/// This rank.
#[unsafe(no_mangle)]
pub extern "C" fn armci_msg_me() -> c_int {
    with_armci("armci_msg_me", |armci| Ok(armci.rank() as c_int))
}

/// Ranks in the job.
#[unsafe(no_mangle)]
pub extern "C" fn armci_msg_nproc() -> c_int {
    with_armci("armci_msg_nproc", |armci| Ok(armci.size() as c_int))
}

/// What the last failed call of this thread said (never NULL; empty if none failed).
#[unsafe(no_mangle)]
pub extern "C" fn nicbar_armci_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Collective allocation: `bytes` here, every rank's base address into `ptr_arr[0..nproc]`.
///
/// # Safety
/// `ptr_arr` must have room for one pointer per rank.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Malloc(ptr_arr: *mut *mut c_void, bytes: c_long) -> c_int {
    with_armci("ARMCI_Malloc", |armci| {
        let bytes =
            usize::try_from(bytes).map_err(|_| ArmciError::Invalid(format!("{bytes} bytes")))?;
        if ptr_arr.is_null() {
            return Err(ArmciError::Invalid("a NULL pointer array".to_owned()));
        }
        let bases = armci.malloc(bytes)?;
        // SAFETY: not NULL, and the caller gives room for one pointer per rank.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr_arr, bases.len()) };
        for (slot, base) in out.iter_mut().zip(bases) {
            *slot = base as *mut c_void;
        }
        Ok(0)
    })
}

/// Collective free of the allocation whose base here is `ptr`.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Free(ptr: *mut c_void) -> c_int {
    with_armci("ARMCI_Free", |armci| armci.free(ptr as u64).map(|()| 0))
}

/// ARMCI's `armci_die`: prints `rank:message: code` on standard output and standard error and
/// aborts the process (under `mpirun` the job ends; the launcher reports the rank's signal).
///
/// # Safety
/// `message` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Error(message: *const c_char, code: c_int) -> ! {
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: not NULL, and the caller promises a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    };
    // The rank if ARMCI runs; never wait for the state here (the error may come from a call
    // that holds it, through a panic hook or a signal handler).
    let rank = STATE
        .try_lock()
        .ok()
        .and_then(|state| state.as_ref().map(|armci| armci.rank() as i64))
        .unwrap_or(-1);
    let line = format!("{rank}:{text}: {code}");
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    eprintln!("{line}");
    std::process::abort()
}

unsafe extern "C" {
    /// The C library's allocator, behind ARMCI_Malloc_local and ARMCI_Free_local.
    fn malloc(size: usize) -> *mut c_void;
    fn free(pointer: *mut c_void);
}

/// Local memory for the buffers of transfers: the C heap's (every put and get here is staged
/// through the port's registered memory, so local buffers need no registration). NULL for a
/// negative length, or if the heap is out of memory.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Malloc_local(bytes: c_long) -> *mut c_void {
    match usize::try_from(bytes) {
        // SAFETY: malloc takes any size; a zero-length request still gets a freeable pointer.
        Ok(bytes) => unsafe { malloc(bytes.max(1)) },
        Err(_) => {
            remember(&format!("ARMCI_Malloc_local: {bytes} bytes"));
            std::ptr::null_mut()
        }
    }
}

/// Frees what [`ARMCI_Malloc_local`] returned (NULL is accepted and ignored). Returns 0.
///
/// # Safety
/// `pointer` must be NULL or a pointer from [`ARMCI_Malloc_local`] not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Free_local(pointer: *mut c_void) -> c_int {
    if !pointer.is_null() {
        // SAFETY: the caller's promise: malloc's pointer, freed once.
        unsafe { free(pointer) };
    }
    0
}

/// Puts `bytes` bytes from `src` to `dst` at `proc`, then stores `value` in the `int` at `flag`
/// there, after the bytes: a rank that sees the flag set sees the bytes.
///
/// # Safety
/// `src` must be readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Put_flag(
    src: *const c_void,
    dst: *mut c_void,
    bytes: c_int,
    flag: *mut c_int,
    value: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_Put_flag", |armci| {
        // SAFETY: the caller's promise for `src`.
        let src = unsafe { self::bytes(src, length(bytes)?) }?;
        armci
            .put_flag(src, dst as u64, flag as u64, value, rank(proc)?)
            .map(|()| 0)
    })
}

/// Puts `bytes` bytes from `src` here to `dst` in `proc`'s allocated memory.
///
/// # Safety
/// `src` must be readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Put(
    src: *const c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_Put", |armci| {
        // SAFETY: the caller's promise for `src`.
        let src = unsafe { self::bytes(src, length(bytes)?) }?;
        armci.put(src, dst as u64, rank(proc)?).map(|()| 0)
    })
}

/// Gets `bytes` bytes from `src` in `proc`'s allocated memory to `dst` here.
///
/// # Safety
/// `dst` must be writable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Get(
    src: *const c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_Get", |armci| {
        // SAFETY: the caller's promise for `dst`.
        let dst = unsafe { bytes_mut(dst, length(bytes)?) }?;
        armci.get(src as u64, dst, rank(proc)?).map(|()| 0)
    })
}

/// `dst[i] += *scale × src[i]` over `bytes` bytes of elements of `optype`, atomic with respect
/// to every other accumulate into `proc`'s memory.
///
/// # Safety
/// `scale` must point to one element of `optype`'s type, `src` be readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Acc(
    optype: c_int,
    scale: *const c_void,
    src: *const c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_Acc", |armci| {
        let element = match optype {
            ACC_INT | ACC_FLT => 4,
            ACC_LNG | ACC_DBL => 8,
            other => return Err(ArmciError::Invalid(format!("accumulate type {other}"))),
        };
        // SAFETY: the caller's promise: one element of the type at `scale`.
        let raw = unsafe { self::bytes(scale, element) }?;
        let scale = match optype {
            ACC_INT => Scale::Int(i32::from_ne_bytes(raw.try_into().unwrap_or_default())),
            ACC_FLT => Scale::Float(f32::from_ne_bytes(raw.try_into().unwrap_or_default())),
            ACC_LNG => Scale::Long(i64::from_ne_bytes(raw.try_into().unwrap_or_default())),
            _ => Scale::Double(f64::from_ne_bytes(raw.try_into().unwrap_or_default())),
        };
        // SAFETY: the caller's promise for `src`.
        let src = unsafe { self::bytes(src, length(bytes)?) }?;
        armci.acc(scale, src, dst as u64, rank(proc)?).map(|()| 0)
    })
}

/// Atomic read-modify-write of the `int` or `long` at `prem` in `proc`'s memory: the previous
/// value goes to `*ploc`; fetch-and-add adds `extra`, swap stores what `*ploc` held.
///
/// # Safety
/// `ploc` must point to an `int` (a `long` for the `_LONG` operations) here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Rmw(
    op: c_int,
    ploc: *mut c_void,
    prem: *mut c_void,
    extra: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_Rmw", |armci| {
        let long = match op {
            FETCH_AND_ADD | SWAP => false,
            FETCH_AND_ADD_LONG | SWAP_LONG => true,
            other => return Err(ArmciError::Invalid(format!("read-modify-write {other}"))),
        };
        let len = if long { 8 } else { 4 };
        // SAFETY: the caller's promise: an int or long at `ploc`, ours for this call.
        let local = unsafe { bytes_mut(ploc, len) }?;
        let operation = match op {
            FETCH_AND_ADD => Rmw::FetchAndAdd(extra),
            FETCH_AND_ADD_LONG => Rmw::FetchAndAddLong(i64::from(extra)),
            SWAP => Rmw::Swap(i32::from_ne_bytes(
                local[..4].try_into().unwrap_or_default(),
            )),
            _ => Rmw::SwapLong(i64::from_ne_bytes(
                local[..8].try_into().unwrap_or_default(),
            )),
        };
        let old = armci.rmw(operation, prem as u64, rank(proc)?)?;
        if long {
            local.copy_from_slice(&old.to_ne_bytes());
        } else {
            local.copy_from_slice(&(old as i32).to_ne_bytes());
        }
        Ok(0)
    })
}

/// Returns once every put from here to `proc` is in `proc`'s memory.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Fence(proc: c_int) {
    or_die("ARMCI_Fence", |armci| armci.fence(rank(proc)?));
}

/// Returns once every put from here is in its target's memory.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_AllFence() {
    or_die("ARMCI_AllFence", Armci::all_fence);
}

/// Returns once every rank called it and every put before it is in its target's memory.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Barrier() {
    or_die("ARMCI_Barrier", Armci::barrier);
}

/// Creates `num` mutexes on this rank (collective).
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Create_mutexes(num: c_int) -> c_int {
    with_armci("ARMCI_Create_mutexes", |armci| {
        let num =
            usize::try_from(num).map_err(|_| ArmciError::Invalid(format!("{num} mutexes")))?;
        armci.create_mutexes(num).map(|()| 0)
    })
}

/// Destroys every rank's mutexes (collective).
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Destroy_mutexes() -> c_int {
    with_armci("ARMCI_Destroy_mutexes", |armci| {
        armci.destroy_mutexes().map(|()| 0)
    })
}

/// Waits until this rank holds mutex `mutex` of `proc`.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Lock(mutex: c_int, proc: c_int) {
    or_die("ARMCI_Lock", |armci| {
        let mutex =
            usize::try_from(mutex).map_err(|_| ArmciError::Invalid(format!("mutex {mutex}")))?;
        armci.lock(mutex, rank(proc)?).map(|_| ())
    });
}

/// Gives mutex `mutex` of `proc` up.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Unlock(mutex: c_int, proc: c_int) {
    or_die("ARMCI_Unlock", |armci| {
        let mutex =
            usize::try_from(mutex).map_err(|_| ArmciError::Invalid(format!("mutex {mutex}")))?;
        armci.unlock(mutex, rank(proc)?)
    });
}
