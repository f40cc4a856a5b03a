//! The C API: ARMCI's functions under their own names (`include/armci.h`), over one [`Armci`]
//! per process.
//!
//! Every export catches panics, checks its pointers and lengths before it makes a slice of them,
//! and reports a failure as ARMCI does: a negative return for the calls that return `int`
//! (`nicbar_armci_last_error()` says what went wrong), and for the `void` calls (fence, barrier,
//! lock) a message on stderr and the end of the process with status 1 — ARMCI's own `armci_die`.
#![allow(
    clippy::too_many_arguments,
    reason = "ARMCI's strided calls take their nine arguments as ARMCI defines them"
)]
#![allow(
    unsafe_code,
    reason = "the C API takes pointers from C: this module checks them and makes the slices"
)]

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_long, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

use nicbar::SharedBytes;

use crate::{Armci, ArmciError, Elements, Handle, ReduceOp, Rmw, Scale, Strides, WORLD_GROUP};

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

/// The accumulate's scale: one element of `optype`'s type at `scale`.
///
/// # Safety
/// `scale` must point to one element of `optype`'s type (ARMCI_ACC_INT, _LNG, _FLT, _DBL).
unsafe fn scale_of(optype: c_int, scale: *const c_void) -> Result<Scale, ArmciError> {
    let element = match optype {
        ACC_INT | ACC_FLT => 4,
        ACC_LNG | ACC_DBL => 8,
        other => return Err(ArmciError::Invalid(format!("accumulate type {other}"))),
    };
    // SAFETY: the caller's promise: one element of the type at `scale`.
    let raw = unsafe { self::bytes(scale, element) }?;
    Ok(match optype {
        ACC_INT => Scale::Int(i32::from_ne_bytes(raw.try_into().unwrap_or_default())),
        ACC_FLT => Scale::Float(f32::from_ne_bytes(raw.try_into().unwrap_or_default())),
        ACC_LNG => Scale::Long(i64::from_ne_bytes(raw.try_into().unwrap_or_default())),
        _ => Scale::Double(f64::from_ne_bytes(raw.try_into().unwrap_or_default())),
    })
}

/// Delivers a get under a handle: `len` staged bytes at `start` to the caller's `address`.
fn land(address: u64, staging: &SharedBytes, start: usize, len: usize) {
    if len == 0 || address == 0 {
        return;
    }
    // SAFETY: `address` is the destination a C caller gave a non-blocking or vector get, which
    // ARMCI's contract keeps writable for `len` bytes until the handle's wait.
    let out = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, len) };
    staging.read(start, out);
}

/// Starts ARMCI in this process (collective): the rank, its port and its peers from the
/// environment. Returns 0, or a negative code.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Init() -> c_int {
    let outcome = catch_unwind(|| {
        let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        if state.is_none() {
            let mut armci = Armci::init()?;
            armci.lander = Some(land);
            *state = Some(armci);
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
        let group = armci.default_group();
        let bases = armci.malloc_group(group, bytes)?;
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
    with_armci("ARMCI_Free", |armci| {
        let group = armci.default_group();
        armci.free_group(group, ptr as u64).map(|()| 0)
    })
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
        // SAFETY: the caller's promise for `scale`.
        let scale = unsafe { scale_of(optype, scale) }?;
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

// ---- strided, vector and non-blocking transfers ------------------------------------------------

/// ARMCI_MAX_STRIDE_LEVEL.
const MAX_LEVELS: c_int = crate::MAX_STRIDE_LEVELS as c_int;

/// A strided call's shape, copied out of its C arrays.
struct Shape {
    src: Vec<usize>,
    dst: Vec<usize>,
    count: Vec<usize>,
}

impl Shape {
    /// Reads `stride_levels` strides from each stride array and `stride_levels + 1` counts.
    ///
    /// # Safety
    /// The arrays must hold that many `int`s (the stride arrays may be NULL for 0 levels).
    unsafe fn read(
        src_stride: *const c_int,
        dst_stride: *const c_int,
        count: *const c_int,
        levels: c_int,
    ) -> Result<Self, ArmciError> {
        if !(0..=MAX_LEVELS).contains(&levels) {
            return Err(ArmciError::Invalid(format!(
                "{levels} stride levels (ARMCI takes 0 to {MAX_LEVELS})"
            )));
        }
        let levels = levels as usize;
        // SAFETY: the caller's promise: `len` ints at each array.
        let read =
            |array: *const c_int, len: usize, what: &str| -> Result<Vec<usize>, ArmciError> {
                if len == 0 {
                    return Ok(Vec::new());
                }
                if array.is_null() {
                    return Err(ArmciError::Invalid(format!("a NULL {what} array")));
                }
                // SAFETY: as above.
                let values = unsafe { std::slice::from_raw_parts(array, len) };
                values
                    .iter()
                    .map(|&v| {
                        usize::try_from(v)
                            .map_err(|_| ArmciError::Invalid(format!("a {what} of {v}")))
                    })
                    .collect()
            };
        Ok(Self {
            src: read(src_stride, levels, "source stride")?,
            dst: read(dst_stride, levels, "destination stride")?,
            count: read(count, levels + 1, "count")?,
        })
    }

    fn strides(&self) -> Strides<'_> {
        Strides {
            src: &self.src,
            dst: &self.dst,
            count: &self.count,
        }
    }
}

/// ARMCI's vector descriptor: `ptr_array_len` segments of `bytes` bytes each.
#[repr(C)]
pub struct armci_giov_t {
    /// The segments' sources.
    pub src_ptr_array: *mut *mut c_void,
    /// The segments' destinations.
    pub dst_ptr_array: *mut *mut c_void,
    /// How many segments.
    pub ptr_array_len: c_int,
    /// Bytes of each segment.
    pub bytes: c_int,
}

/// ARMCI's non-blocking handle: this library keeps its number in the first two ints of `data`
/// (0: none; ARMCI_INIT_HANDLE zeroes them).
#[repr(C)]
pub struct armci_hdl_t {
    /// The handle's number, as two native `int`s.
    pub data: [c_int; 4],
    /// Room, as in ARMCI's own.
    pub dummy: [f64; 8],
}

/// Every (source, destination) segment of `len` descriptors at `darr`.
///
/// # Safety
/// `darr` must hold `len` descriptors whose arrays hold `ptr_array_len` pointers each.
unsafe fn segments(
    darr: *const armci_giov_t,
    len: c_int,
) -> Result<Vec<(u64, u64, usize)>, ArmciError> {
    let len =
        usize::try_from(len).map_err(|_| ArmciError::Invalid(format!("{len} descriptors")))?;
    if len == 0 {
        return Ok(Vec::new());
    }
    if darr.is_null() {
        return Err(ArmciError::Invalid("a NULL descriptor array".to_owned()));
    }
    // SAFETY: the caller's promise: `len` descriptors.
    let descriptors = unsafe { std::slice::from_raw_parts(darr, len) };
    let mut out = Vec::new();
    for d in descriptors {
        let count = usize::try_from(d.ptr_array_len)
            .map_err(|_| ArmciError::Invalid(format!("{} segments", d.ptr_array_len)))?;
        let bytes = length(d.bytes)?;
        if count == 0 {
            continue;
        }
        if d.src_ptr_array.is_null() || d.dst_ptr_array.is_null() {
            return Err(ArmciError::Invalid("a NULL segment array".to_owned()));
        }
        // SAFETY: the caller's promise: `count` pointers in each array.
        let (srcs, dsts) = unsafe {
            (
                std::slice::from_raw_parts(d.src_ptr_array, count),
                std::slice::from_raw_parts(d.dst_ptr_array, count),
            )
        };
        out.extend(
            srcs.iter()
                .zip(dsts)
                .map(|(&s, &t)| (s as u64, t as u64, bytes)),
        );
    }
    Ok(out)
}

/// The local source bytes of each segment, paired with its remote destination.
///
/// # Safety
/// Every source must be readable for its length.
unsafe fn local_sources<'a>(
    segments: &[(u64, u64, usize)],
) -> Result<Vec<(&'a [u8], u64)>, ArmciError> {
    segments
        .iter()
        // SAFETY: the caller's promise for each source.
        .map(|&(src, dst, len)| Ok((unsafe { bytes(src as *const c_void, len) }?, dst)))
        .collect()
}

/// The handle an operation goes under: the one in `*hdl` if it is still live (ARMCI's aggregate
/// handles gather several operations), else a fresh one written there; `proc`'s implicit handle
/// when `hdl` is NULL.
///
/// # Safety
/// `hdl` must be NULL or point to an `armci_hdl_t`.
unsafe fn handle_for(armci: &mut Armci, hdl: *mut armci_hdl_t, proc: usize) -> Handle {
    if hdl.is_null() {
        return armci.implicit_handle(proc);
    }
    // SAFETY: not NULL, and the caller's promise: an armci_hdl_t.
    let hdl = unsafe { &mut *hdl };
    let number = handle_number(hdl);
    if let Some(handle) = Handle::from_number(number)
        && armci.handles.contains_key(&handle.get())
    {
        return handle;
    }
    let handle = armci.new_handle();
    let raw = handle.get().to_ne_bytes();
    hdl.data[0] = c_int::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]]);
    hdl.data[1] = c_int::from_ne_bytes([raw[4], raw[5], raw[6], raw[7]]);
    // An operation that posts nothing (an accumulate, which completes before it returns) still
    // leaves a handle that its wait finds.
    armci.handles.entry(handle.get()).or_default();
    handle
}

fn handle_number(hdl: &armci_hdl_t) -> u64 {
    let (low, high) = (hdl.data[0].to_ne_bytes(), hdl.data[1].to_ne_bytes());
    u64::from_ne_bytes([
        low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3],
    ])
}

/// Strided put: `count[0]` bytes at each point of the `count[1..=stride_levels]` grid, one NIC
/// put per contiguous run. Returns once `src_ptr` may be reused.
///
/// # Safety
/// The arrays must hold `stride_levels` strides and `stride_levels + 1` counts; the source
/// must be readable over the shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_PutS(
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_PutS", |armci| {
        // SAFETY: the caller's promises, passed on.
        unsafe {
            put_strided(
                armci,
                src_ptr,
                src_stride_arr,
                dst_ptr,
                dst_stride_arr,
                count,
                stride_levels,
                proc,
                None,
            )
        }
    })
}

/// The strided put of [`ARMCI_PutS`] and [`ARMCI_NbPutS`]: under `hdl`'s handle if given.
///
/// # Safety
/// As [`ARMCI_NbPutS`].
unsafe fn put_strided(
    armci: &mut Armci,
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
    hdl: Option<*mut armci_hdl_t>,
) -> Result<c_int, ArmciError> {
    let rank = rank(proc)?;
    // SAFETY: the caller's promise for the arrays.
    let shape = unsafe { Shape::read(src_stride_arr, dst_stride_arr, count, stride_levels) }?;
    let strides = shape.strides();
    // SAFETY: the caller's promise: the source is readable over the shape.
    let src = unsafe { self::bytes(src_ptr, strides.src_extent()?) }?;
    // SAFETY: the caller's promise for `hdl`.
    let handle = hdl.map(|hdl| unsafe { handle_for(armci, hdl, rank) });
    armci
        .put_strided(src, dst_ptr as u64, strides, rank, handle)
        .map(|()| 0)
}

/// Strided get into `dst_ptr`'s shape; returns once the bytes are here.
///
/// # Safety
/// As [`ARMCI_PutS`], the destination writable over the shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_GetS(
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_GetS", |armci| {
        // SAFETY: the caller's promise for the arrays.
        let shape = unsafe { Shape::read(src_stride_arr, dst_stride_arr, count, stride_levels) }?;
        let strides = shape.strides();
        // SAFETY: the caller's promise: the destination is writable over the shape.
        let dst = unsafe { bytes_mut(dst_ptr, strides.dst_extent()?) }?;
        armci
            .get_strided(src_ptr as u64, dst, strides, rank(proc)?)
            .map(|()| 0)
    })
}

/// Strided accumulate: `dst += *scale × src` over each run, under one hold of `proc`'s
/// accumulate lock; complete at `proc` on return.
///
/// # Safety
/// As [`ARMCI_PutS`]; `scale` points to one element of `optype`'s type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_AccS(
    optype: c_int,
    scale: *mut c_void,
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_AccS", |armci| {
        // SAFETY: the caller's promises for the scale and the arrays.
        let scale = unsafe { scale_of(optype, scale) }?;
        // SAFETY: as above.
        let shape = unsafe { Shape::read(src_stride_arr, dst_stride_arr, count, stride_levels) }?;
        let strides = shape.strides();
        // SAFETY: the caller's promise: the source is readable over the shape.
        let src = unsafe { self::bytes(src_ptr, strides.src_extent()?) }?;
        armci
            .acc_strided(scale, src, dst_ptr as u64, strides, rank(proc)?)
            .map(|()| 0)
    })
}

/// Vector put: every segment of every descriptor, one NIC put each.
///
/// # Safety
/// `darr` must hold `len` descriptors whose sources are readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_PutV(darr: *mut armci_giov_t, len: c_int, proc: c_int) -> c_int {
    with_armci("ARMCI_PutV", |armci| {
        // SAFETY: the caller's promise for the descriptors.
        let segments = unsafe { segments(darr, len) }?;
        // SAFETY: the caller's promise: every source is readable.
        let pieces = unsafe { local_sources(&segments) }?;
        armci.put_pieces(&pieces, rank(proc)?, None).map(|()| 0)
    })
}

/// Vector get: every segment's get posted, then all waited for.
///
/// # Safety
/// `darr` must hold `len` descriptors whose destinations are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_GetV(darr: *mut armci_giov_t, len: c_int, proc: c_int) -> c_int {
    with_armci("ARMCI_GetV", |armci| {
        // SAFETY: the caller's promise for the descriptors.
        let segments = unsafe { segments(darr, len) }?;
        let rank = rank(proc)?;
        let handle = armci.new_handle();
        let mut posted = Ok(());
        for &(src, dst, bytes) in &segments {
            posted = armci.get_to_address(src, bytes, dst, rank, handle);
            if posted.is_err() {
                break;
            }
        }
        let waited = armci.wait_handle(handle);
        posted.and(waited).map(|()| 0)
    })
}

/// Vector accumulate: every segment, under one hold of `proc`'s accumulate lock.
///
/// # Safety
/// As [`ARMCI_PutV`]; `scale` points to one element of `op`'s type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_AccV(
    op: c_int,
    scale: *mut c_void,
    darr: *mut armci_giov_t,
    len: c_int,
    proc: c_int,
) -> c_int {
    with_armci("ARMCI_AccV", |armci| {
        // SAFETY: the caller's promises for the scale and the descriptors.
        let scale = unsafe { scale_of(op, scale) }?;
        // SAFETY: as above.
        let segments = unsafe { segments(darr, len) }?;
        // SAFETY: the caller's promise: every source is readable.
        let pieces = unsafe { local_sources(&segments) }?;
        armci.acc_pieces(scale, &pieces, rank(proc)?).map(|()| 0)
    })
}

/// Non-blocking put: returns once `src` may be reused; the handle's wait returns once the bytes
/// are in `proc`'s memory (the NIC's remote completion).
///
/// # Safety
/// `src` readable for `bytes` bytes; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbPut(
    src: *mut c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbPut", |armci| {
        let rank = rank(proc)?;
        // SAFETY: the caller's promise for `src`.
        let src = unsafe { self::bytes(src, length(bytes)?) }?;
        // SAFETY: the caller's promise for `hdl`.
        let handle = unsafe { handle_for(armci, hdl, rank) };
        armci
            .put_pieces(&[(src, dst as u64)], rank, Some(handle))
            .map(|()| 0)
    })
}

/// Non-blocking get: the bytes are at `dst` once the handle's wait returns.
///
/// # Safety
/// `dst` writable for `bytes` bytes until the wait; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbGet(
    src: *mut c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbGet", |armci| {
        let rank = rank(proc)?;
        let len = length(bytes)?;
        if len > 0 && dst.is_null() {
            return Err(ArmciError::Invalid("a NULL buffer".to_owned()));
        }
        // SAFETY: the caller's promise for `hdl`.
        let handle = unsafe { handle_for(armci, hdl, rank) };
        armci
            .get_to_address(src as u64, len, dst as u64, rank, handle)
            .map(|()| 0)
    })
}

/// Non-blocking accumulate: the accumulate is a locked read-modify-write at the target, done
/// (and in `proc`'s memory) before this returns; the handle's wait returns at once.
///
/// # Safety
/// As [`ARMCI_Acc`]; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbAcc(
    optype: c_int,
    scale: *mut c_void,
    src: *mut c_void,
    dst: *mut c_void,
    bytes: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbAcc", |armci| {
        let rank = rank(proc)?;
        // SAFETY: the caller's promise for `hdl`.
        unsafe { handle_for(armci, hdl, rank) };
        // SAFETY: the caller's promises for `scale` and `src`.
        let scale = unsafe { scale_of(optype, scale) }?;
        // SAFETY: as above.
        let src = unsafe { self::bytes(src, length(bytes)?) }?;
        armci.acc(scale, src, dst as u64, rank).map(|()| 0)
    })
}

/// Non-blocking strided put (one NIC put per contiguous run, all under the handle).
///
/// # Safety
/// As [`ARMCI_PutS`]; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbPutS(
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbPutS", |armci| {
        // SAFETY: the caller's promises, passed on.
        unsafe {
            put_strided(
                armci,
                src_ptr,
                src_stride_arr,
                dst_ptr,
                dst_stride_arr,
                count,
                stride_levels,
                proc,
                Some(hdl),
            )
        }
    })
}

/// Non-blocking strided get: one NIC get per contiguous run, landed by the handle's wait.
///
/// # Safety
/// As [`ARMCI_GetS`], the destination writable until the wait; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbGetS(
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbGetS", |armci| {
        let rank = rank(proc)?;
        // SAFETY: the caller's promise for the arrays.
        let shape = unsafe { Shape::read(src_stride_arr, dst_stride_arr, count, stride_levels) }?;
        let runs = shape.strides().runs()?;
        if runs.len > 0 && dst_ptr.is_null() {
            return Err(ArmciError::Invalid("a NULL buffer".to_owned()));
        }
        // SAFETY: the caller's promise for `hdl`.
        let handle = unsafe { handle_for(armci, hdl, rank) };
        for &(from, to) in &runs.offsets {
            armci.get_to_address(
                (src_ptr as u64).wrapping_add(from as u64),
                runs.len,
                (dst_ptr as u64).wrapping_add(to as u64),
                rank,
                handle,
            )?;
        }
        Ok(0)
    })
}

/// Non-blocking strided accumulate: done before it returns, as [`ARMCI_NbAcc`].
///
/// # Safety
/// As [`ARMCI_AccS`]; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbAccS(
    optype: c_int,
    scale: *mut c_void,
    src_ptr: *mut c_void,
    src_stride_arr: *mut c_int,
    dst_ptr: *mut c_void,
    dst_stride_arr: *mut c_int,
    count: *mut c_int,
    stride_levels: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    if !hdl.is_null() {
        let made = with_armci("ARMCI_NbAccS", |armci| {
            // SAFETY: the caller's promise for `hdl`.
            unsafe { handle_for(armci, hdl, rank(proc)?) };
            Ok(0)
        });
        if made < 0 {
            return made;
        }
    }
    // SAFETY: the caller's promises, passed on.
    unsafe {
        ARMCI_AccS(
            optype,
            scale,
            src_ptr,
            src_stride_arr,
            dst_ptr,
            dst_stride_arr,
            count,
            stride_levels,
            proc,
        )
    }
}

/// Non-blocking vector put: one NIC put per segment, under the handle.
///
/// # Safety
/// As [`ARMCI_PutV`]; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbPutV(
    darr: *mut armci_giov_t,
    len: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbPutV", |armci| {
        let rank = rank(proc)?;
        // SAFETY: the caller's promise for the descriptors.
        let segments = unsafe { segments(darr, len) }?;
        // SAFETY: the caller's promise: every source is readable.
        let pieces = unsafe { local_sources(&segments) }?;
        // SAFETY: the caller's promise for `hdl`.
        let handle = unsafe { handle_for(armci, hdl, rank) };
        armci.put_pieces(&pieces, rank, Some(handle)).map(|()| 0)
    })
}

/// Non-blocking vector get: one NIC get per segment, landed by the handle's wait.
///
/// # Safety
/// As [`ARMCI_GetV`], destinations writable until the wait; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbGetV(
    darr: *mut armci_giov_t,
    len: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    with_armci("ARMCI_NbGetV", |armci| {
        let rank = rank(proc)?;
        // SAFETY: the caller's promise for the descriptors.
        let segments = unsafe { segments(darr, len) }?;
        // SAFETY: the caller's promise for `hdl`.
        let handle = unsafe { handle_for(armci, hdl, rank) };
        for &(src, dst, bytes) in &segments {
            if bytes > 0 && dst == 0 {
                return Err(ArmciError::Invalid("a NULL buffer".to_owned()));
            }
            armci.get_to_address(src, bytes, dst, rank, handle)?;
        }
        Ok(0)
    })
}

/// Non-blocking vector accumulate: done before it returns, as [`ARMCI_NbAcc`].
///
/// # Safety
/// As [`ARMCI_AccV`]; `hdl` NULL or an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_NbAccV(
    op: c_int,
    scale: *mut c_void,
    darr: *mut armci_giov_t,
    len: c_int,
    proc: c_int,
    hdl: *mut armci_hdl_t,
) -> c_int {
    if !hdl.is_null() {
        let made = with_armci("ARMCI_NbAccV", |armci| {
            // SAFETY: the caller's promise for `hdl`.
            unsafe { handle_for(armci, hdl, rank(proc)?) };
            Ok(0)
        });
        if made < 0 {
            return made;
        }
    }
    // SAFETY: the caller's promises, passed on.
    unsafe { ARMCI_AccV(op, scale, darr, len, proc) }
}

/// Waits until every operation under the handle has ended: a put's bytes in its target's
/// memory, a get's here. Returns 0, or a negative code for a failed operation. The handle is
/// free for new operations afterwards.
///
/// # Safety
/// `hdl` must be NULL or point to an `armci_hdl_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Wait(hdl: *mut armci_hdl_t) -> c_int {
    if hdl.is_null() {
        return 0;
    }
    // SAFETY: not NULL, and the caller's promise.
    let hdl = unsafe { &mut *hdl };
    let Some(handle) = Handle::from_number(handle_number(hdl)) else {
        return 0;
    };
    let outcome = with_armci("ARMCI_Wait", |armci| armci.wait_handle(handle).map(|()| 0));
    hdl.data[0] = 0;
    hdl.data[1] = 0;
    outcome
}

/// 0 if every operation under the handle has ended (as after [`ARMCI_Wait`]), 1 if some are
/// still in the NIC; never blocks. A negative code for a failed operation.
///
/// # Safety
/// As [`ARMCI_Wait`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Test(hdl: *mut armci_hdl_t) -> c_int {
    if hdl.is_null() {
        return 0;
    }
    // SAFETY: not NULL, and the caller's promise.
    let hdl = unsafe { &mut *hdl };
    let Some(handle) = Handle::from_number(handle_number(hdl)) else {
        return 0;
    };
    let outcome = with_armci("ARMCI_Test", |armci| {
        armci
            .test_handle(handle)
            .map(|done| if done { 0 } else { 1 })
    });
    if outcome <= 0 {
        hdl.data[0] = 0;
        hdl.data[1] = 0;
    }
    outcome
}

/// Waits for every operation made with a NULL handle.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_WaitAll() -> c_int {
    with_armci("ARMCI_WaitAll", |armci| {
        armci.wait_implicit(None).map(|()| 0)
    })
}

/// Waits for every operation to `proc` made with a NULL handle.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_WaitProc(proc: c_int) -> c_int {
    with_armci("ARMCI_WaitProc", |armci| {
        armci.wait_implicit(Some(rank(proc)?)).map(|()| 0)
    })
}

/// ARMCI's aggregation hint: every handle here gathers the operations made under it until its
/// wait, so this changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_SET_AGGREGATE_HANDLE(_hdl: *mut armci_hdl_t) {}

/// Ends the aggregation hint (nothing to do, as for [`ARMCI_SET_AGGREGATE_HANDLE`]).
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_UNSET_AGGREGATE_HANDLE(_hdl: *mut armci_hdl_t) {}

// ---- process groups and the armci_msg collectives ---------------------------------------------

/// ARMCI's group handle: the group's id (0: every rank).
#[allow(non_camel_case_types, reason = "ARMCI's name")]
pub type ARMCI_Group = c_int;

/// The id at `group`.
///
/// # Safety
/// `group` must be NULL or point to an `ARMCI_Group`.
unsafe fn group_id(group: *const ARMCI_Group) -> Result<usize, ArmciError> {
    if group.is_null() {
        return Err(ArmciError::Invalid("a NULL group".to_owned()));
    }
    // SAFETY: not NULL, and the caller's promise.
    let id = unsafe { *group };
    usize::try_from(id).map_err(|_| ArmciError::Invalid(format!("group {id}")))
}

/// Writes `value` to `out` if it is not NULL.
///
/// # Safety
/// `out` must be NULL or point to a writable `int`.
unsafe fn store(out: *mut c_int, value: c_int) {
    if !out.is_null() {
        // SAFETY: not NULL, and the caller's promise.
        unsafe { *out = value };
    }
}

/// The group of the default group's ranks `pid_list[0..n]` (collective over the default
/// group: every member calls it, in the same order); its id goes to `*group_out`.
///
/// # Safety
/// `pid_list` must hold `n` ints; `group_out` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_create(
    n: c_int,
    pid_list: *const c_int,
    group_out: *mut ARMCI_Group,
) {
    or_die("ARMCI_Group_create", |armci| {
        let n = usize::try_from(n).map_err(|_| ArmciError::Invalid(format!("{n} ranks")))?;
        if n == 0 || pid_list.is_null() || group_out.is_null() {
            return Err(ArmciError::Invalid(
                "a group needs ranks and a place for its handle".to_owned(),
            ));
        }
        // SAFETY: the caller's promise: n ints.
        let ranks = unsafe { std::slice::from_raw_parts(pid_list, n) }
            .iter()
            .map(|&r| usize::try_from(r).map_err(|_| ArmciError::Invalid(format!("rank {r}"))))
            .collect::<Result<Vec<usize>, _>>()?;
        let id = armci.group_create(&ranks)?;
        // SAFETY: the caller's promise: an ARMCI_Group to write.
        unsafe { *group_out = id as c_int };
        Ok(())
    });
}

/// Forgets the group here (never the world's).
///
/// # Safety
/// `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_free(group: *mut ARMCI_Group) {
    or_die("ARMCI_Group_free", |armci| {
        // SAFETY: the caller's promise.
        armci.group_free(unsafe { group_id(group) }?)
    });
}

/// This rank's place in the group into `*rank` (-1 if not a member). Returns 0.
///
/// # Safety
/// `group` must point to an `ARMCI_Group`, `rank` to an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_rank(group: *mut ARMCI_Group, rank: *mut c_int) -> c_int {
    with_armci("ARMCI_Group_rank", |armci| {
        // SAFETY: the caller's promise.
        let (me, _) = armci.group_rank_and_size(unsafe { group_id(group) }?)?;
        // SAFETY: the caller's promise.
        unsafe { store(rank, me.map_or(-1, |m| m as c_int)) };
        Ok(0)
    })
}

/// The group's size into `*size`.
///
/// # Safety
/// `group` must point to an `ARMCI_Group`, `size` to an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_size(group: *mut ARMCI_Group, size: *mut c_int) {
    or_die("ARMCI_Group_size", |armci| {
        // SAFETY: the caller's promise.
        let (_, members) = armci.group_rank_and_size(unsafe { group_id(group) }?)?;
        // SAFETY: the caller's promise.
        unsafe { store(size, members as c_int) };
        Ok(())
    });
}

/// Makes the group the default: ARMCI_Malloc, ARMCI_Free and ARMCI_Group_create then run over
/// it.
///
/// # Safety
/// `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_set_default(group: *mut ARMCI_Group) {
    or_die("ARMCI_Group_set_default", |armci| {
        // SAFETY: the caller's promise.
        armci.set_default_group(unsafe { group_id(group) }?)
    });
}

/// The default group into `*group_out`.
///
/// # Safety
/// `group_out` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_get_default(group_out: *mut ARMCI_Group) {
    or_die("ARMCI_Group_get_default", |armci| {
        // SAFETY: the caller's promise.
        unsafe { store(group_out, armci.default_group() as c_int) };
        Ok(())
    });
}

/// The group of every rank into `*group_out`.
///
/// # Safety
/// `group_out` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Group_get_world(group_out: *mut ARMCI_Group) {
    // SAFETY: the caller's promise.
    unsafe { store(group_out, WORLD_GROUP as c_int) };
}

/// The rank of the group's member `group_rank` (negative if there is none).
///
/// # Safety
/// `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Absolute_id(group: *mut ARMCI_Group, group_rank: c_int) -> c_int {
    with_armci("ARMCI_Absolute_id", |armci| {
        // SAFETY: the caller's promise.
        let id = unsafe { group_id(group) }?;
        armci
            .absolute_rank(id, rank(group_rank)?)
            .map(|r| r as c_int)
    })
}

/// ARMCI_Malloc over the group's members (collective over the group); `ptr_arr[i]` receives
/// group rank i's address.
///
/// # Safety
/// `ptr_arr` must have room for one pointer per member; `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Malloc_group(
    ptr_arr: *mut *mut c_void,
    bytes: c_long,
    group: *mut ARMCI_Group,
) -> c_int {
    with_armci("ARMCI_Malloc_group", |armci| {
        let bytes =
            usize::try_from(bytes).map_err(|_| ArmciError::Invalid(format!("{bytes} bytes")))?;
        if ptr_arr.is_null() {
            return Err(ArmciError::Invalid("a NULL pointer array".to_owned()));
        }
        // SAFETY: the caller's promise.
        let bases = armci.malloc_group(unsafe { group_id(group) }?, bytes)?;
        // SAFETY: not NULL, and the caller gives room for one pointer per member.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr_arr, bases.len()) };
        for (slot, base) in out.iter_mut().zip(bases) {
            *slot = base as *mut c_void;
        }
        Ok(0)
    })
}

/// Frees an ARMCI_Malloc_group allocation (collective over the group; puts to it land first).
///
/// # Safety
/// `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ARMCI_Free_group(ptr: *mut c_void, group: *mut ARMCI_Group) -> c_int {
    with_armci("ARMCI_Free_group", |armci| {
        // SAFETY: the caller's promise.
        let id = unsafe { group_id(group) }?;
        armci.free_group(id, ptr as u64).map(|()| 0)
    })
}

/// The NIC's barrier of every rank (no fence: ARMCI_Barrier also completes the puts).
#[unsafe(no_mangle)]
pub extern "C" fn armci_msg_barrier() {
    or_die("armci_msg_barrier", |armci| {
        armci.group_barrier(WORLD_GROUP)
    });
}

/// The NIC's barrier of the group's members.
///
/// # Safety
/// `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn armci_msg_group_barrier(group: *mut ARMCI_Group) {
    or_die("armci_msg_group_barrier", |armci| {
        // SAFETY: the caller's promise.
        armci.group_barrier(unsafe { group_id(group) }?)
    });
}

/// Broadcast of `len` bytes at `buffer` from `root` within group `id`.
///
/// # Safety
/// `buffer` must be writable for `len` bytes.
unsafe fn broadcast(
    name: &str,
    id: Option<*mut ARMCI_Group>,
    buffer: *mut c_void,
    len: c_int,
    root: c_int,
) {
    or_die(name, |armci| {
        let id = match id {
            // SAFETY: the caller's promise.
            Some(group) => unsafe { group_id(group) }?,
            None => WORLD_GROUP,
        };
        // SAFETY: the caller's promise.
        let data = unsafe { bytes_mut(buffer, length(len)?) }?;
        armci.broadcast(id, rank(root)?, data)
    });
}

/// Every rank's `buffer` becomes `root`'s (`len` bytes, the same on every rank).
///
/// # Safety
/// `buffer` must be writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn armci_msg_brdcst(buffer: *mut c_void, len: c_int, root: c_int) {
    // SAFETY: the caller's promise.
    unsafe { broadcast("armci_msg_brdcst", None, buffer, len, root) };
}

/// The same as [`armci_msg_brdcst`] (ARMCI has both names).
///
/// # Safety
/// As [`armci_msg_brdcst`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn armci_msg_bcast(buffer: *mut c_void, len: c_int, root: c_int) {
    // SAFETY: the caller's promise.
    unsafe { broadcast("armci_msg_bcast", None, buffer, len, root) };
}

/// [`armci_msg_brdcst`] within a group, `root` a group rank.
///
/// # Safety
/// As [`armci_msg_brdcst`]; `group` must point to an `ARMCI_Group`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn armci_msg_group_bcast(
    buffer: *mut c_void,
    len: c_int,
    root: c_int,
    group: *mut ARMCI_Group,
) {
    // SAFETY: the caller's promise.
    unsafe { broadcast("armci_msg_group_bcast", Some(group), buffer, len, root) };
}

/// A reduction of `n` elements at `x` by the operation named `op`, within group `id`.
///
/// # Safety
/// `x` must hold `n` elements; `op` must be a NUL-terminated string.
unsafe fn reduce(
    name: &str,
    id: Option<*mut ARMCI_Group>,
    elements: Elements,
    x: *mut c_void,
    n: c_int,
    op: *const c_char,
) {
    or_die(name, |armci| {
        if op.is_null() {
            return Err(ArmciError::Invalid("a NULL operation".to_owned()));
        }
        // SAFETY: not NULL, and the caller's promise: a NUL-terminated string.
        let op_name = unsafe { std::ffi::CStr::from_ptr(op) }.to_string_lossy();
        let op = ReduceOp::from_name(&op_name)
            .ok_or_else(|| ArmciError::Invalid(format!("the operation {op_name:?}")))?;
        let id = match id {
            // SAFETY: the caller's promise.
            Some(group) => unsafe { group_id(group) }?,
            None => WORLD_GROUP,
        };
        let len = length(n)? * elements.element_len();
        // SAFETY: the caller's promise: n elements at x.
        let data = unsafe { bytes_mut(x, len) }?;
        armci.reduce_all(id, elements, op, data)
    });
}

macro_rules! gop {
    ($world:ident, $group:ident, $t:ty, $elements:expr) => {
        /// `x[i]` becomes `op` (`"+"`, `"*"`, `"max"`, `"min"`, `"absmax"`, `"absmin"`, and for
        /// integers `"or"`) over every rank's `x[i]`, alike on every rank.
        ///
        /// # Safety
        /// `x` must hold `n` elements; `op` must be a NUL-terminated string.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $world(x: *mut $t, n: c_int, op: *const c_char) {
            // SAFETY: the caller's promise.
            unsafe { reduce(stringify!($world), None, $elements, x.cast(), n, op) };
        }

        /// As the call without `group`, over the group's members.
        ///
        /// # Safety
        /// As that call; `group` must point to an `ARMCI_Group`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $group(
            x: *mut $t,
            n: c_int,
            op: *const c_char,
            group: *mut ARMCI_Group,
        ) {
            // SAFETY: the caller's promise.
            unsafe { reduce(stringify!($group), Some(group), $elements, x.cast(), n, op) };
        }
    };
}

gop!(armci_msg_igop, armci_msg_group_igop, c_int, Elements::Int);
gop!(armci_msg_lgop, armci_msg_group_lgop, c_long, Elements::Long);
gop!(
    armci_msg_llgop,
    armci_msg_group_llgop,
    std::ffi::c_longlong,
    Elements::Long
);
gop!(armci_msg_fgop, armci_msg_group_fgop, f32, Elements::Float);
gop!(armci_msg_dgop, armci_msg_group_dgop, f64, Elements::Double);

// ---- start-up forms and single values ----------------------------------------------------------

/// ARMCI_Init for programs that pass `main`'s arguments (they are not needed: the rank and
/// peers come from the environment).
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Init_args(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    ARMCI_Init()
}

/// 1 between ARMCI_Init and ARMCI_Finalize, else 0.
#[unsafe(no_mangle)]
pub extern "C" fn ARMCI_Initialized() -> c_int {
    c_int::from(
        STATE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some(),
    )
}

macro_rules! put_value {
    ($name:ident, $t:ty) => {
        /// Puts one value to `dst` at `proc` (returns once the value may change: at once).
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(src: $t, dst: *mut c_void, proc: c_int) -> c_int {
            with_armci(stringify!($name), |armci| {
                armci
                    .put(&src.to_ne_bytes(), dst as u64, rank(proc)?)
                    .map(|()| 0)
            })
        }
    };
}

put_value!(ARMCI_PutValueInt, c_int);
put_value!(ARMCI_PutValueLong, c_long);
put_value!(ARMCI_PutValueFloat, f32);
put_value!(ARMCI_PutValueDouble, f64);

macro_rules! get_value {
    ($name:ident, $t:ty) => {
        /// The value at `src` in `proc`'s memory (a failure prints why and ends the process:
        /// the call has no way to report it).
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(src: *mut c_void, proc: c_int) -> $t {
            let mut bytes = [0u8; size_of::<$t>()];
            or_die(stringify!($name), |armci| {
                armci.get(src as u64, &mut bytes, rank(proc)?)
            });
            <$t>::from_ne_bytes(bytes)
        }
    };
}

get_value!(ARMCI_GetValueInt, c_int);
get_value!(ARMCI_GetValueLong, c_long);
get_value!(ARMCI_GetValueFloat, f32);
get_value!(ARMCI_GetValueDouble, f64);
