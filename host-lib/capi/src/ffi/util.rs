//! The exports of GM's utilities that GM programs call: memory from the C allocator, byte and
//! string helpers, page-aligned memory, the process id, base-2 logarithms, pseudo-random numbers
//! and a hex dump.

use core::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::io::Write as _;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::libc;

use super::guard;
use crate::types::*;

/// A process id (GM's `gm_pid_t`).
pub type gm_pid_t = gm_u32_t;

/// The length of a memory page: what gm_page_alloc returns and gm_alloc_pages rounds up to.
#[unsafe(no_mangle)]
pub static GM_PAGE_LEN: c_ulong = 4096;

/// The state of gm_rand.
static RANDOM: AtomicU64 = AtomicU64::new(1);

/// Copies `length` bytes from `from` to `to` (the ranges may overlap).
///
/// # Safety
/// `from` and `to` point to `length` bytes (readable, and writable respectively).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_bcopy(from: *const c_void, to: *mut c_void, length: gm_size_t) {
    guard("gm_bcopy", (), || {
        if length > 0 {
            // SAFETY: as the caller promised; `copy` allows overlap.
            unsafe { core::ptr::copy(from.cast::<u8>(), to.cast::<u8>(), length as usize) };
        }
    });
}

/// Zeroes `length` bytes at `pointer`.
///
/// # Safety
/// `pointer` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_bzero(pointer: *mut c_void, length: gm_size_t) {
    guard("gm_bzero", (), || {
        if length > 0 {
            // SAFETY: as the caller promised.
            unsafe { core::ptr::write_bytes(pointer.cast::<u8>(), 0, length as usize) };
        }
    });
}

/// Sets `length` bytes at `pointer` to `value`; returns `pointer`.
///
/// # Safety
/// `pointer` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_memset(
    pointer: *mut c_void,
    value: c_int,
    length: gm_size_t,
) -> *mut c_void {
    guard("gm_memset", pointer, || {
        if length > 0 {
            // SAFETY: as the caller promised.
            unsafe { core::ptr::write_bytes(pointer.cast::<u8>(), value as u8, length as usize) };
        }
        pointer
    })
}

/// Compares `length` bytes as memcmp does.
///
/// # Safety
/// `a` and `b` point to `length` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_memcmp(a: *const c_void, b: *const c_void, length: gm_size_t) -> c_int {
    guard("gm_memcmp", 0, || {
        // SAFETY: as the caller promised.
        unsafe { libc::memcmp(a, b, length as usize) }
    })
}

/// Allocates `length` bytes of ordinary memory (not DMA memory); NULL if there is none. Free it
/// with gm_free.
#[unsafe(no_mangle)]
pub extern "C" fn gm_malloc(length: gm_size_t) -> *mut c_void {
    // SAFETY: malloc takes any length.
    guard("gm_malloc", core::ptr::null_mut(), || unsafe {
        libc::malloc(length as usize)
    })
}

/// Allocates `count` elements of `length` bytes, zeroed (note GM's argument order); NULL if
/// there is no memory. Free it with gm_free.
#[unsafe(no_mangle)]
pub extern "C" fn gm_calloc(length: gm_size_t, count: gm_size_t) -> *mut c_void {
    // SAFETY: calloc takes any sizes and checks their product.
    guard("gm_calloc", core::ptr::null_mut(), || unsafe {
        libc::calloc(count as usize, length as usize)
    })
}

/// Frees memory from gm_malloc, gm_calloc or gm_strdup; NULL is ignored.
///
/// # Safety
/// `pointer` is NULL or memory from those calls, not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_free(pointer: *mut c_void) {
    // SAFETY: as the caller promised.
    guard("gm_free", (), || unsafe { libc::free(pointer) });
}

/// A page of memory, page-aligned and uninitialised (GM_PAGE_LEN bytes); NULL if there is none.
/// Free it with gm_page_free.
#[unsafe(no_mangle)]
pub extern "C" fn gm_page_alloc() -> *mut c_void {
    guard("gm_page_alloc", core::ptr::null_mut(), || {
        gm_alloc_pages(GM_PAGE_LEN as gm_size_t)
    })
}

/// Frees a page from gm_page_alloc; NULL is ignored.
///
/// # Safety
/// `pointer` is NULL or a page from gm_page_alloc, not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_page_free(pointer: *mut c_void) {
    // SAFETY: as the caller promised (pages come from posix_memalign, freed by free).
    guard("gm_page_free", (), || unsafe { libc::free(pointer) });
}

/// `length` bytes rounded up to whole pages, page-aligned and uninitialised; NULL if there is no
/// memory. Free it with gm_free_pages.
#[unsafe(no_mangle)]
pub extern "C" fn gm_alloc_pages(length: gm_size_t) -> *mut c_void {
    guard("gm_alloc_pages", core::ptr::null_mut(), || {
        let page = GM_PAGE_LEN as usize;
        let Some(rounded) = (length as usize).max(1).checked_next_multiple_of(page) else {
            return core::ptr::null_mut();
        };
        let mut pointer = core::ptr::null_mut();
        // SAFETY: `pointer` is writable; the alignment is a power of two and a multiple of the
        // size of a pointer.
        let failed = unsafe { libc::posix_memalign(&mut pointer, page, rounded) };
        if failed == 0 {
            pointer
        } else {
            core::ptr::null_mut()
        }
    })
}

/// Frees pages from gm_alloc_pages; NULL is ignored.
///
/// # Safety
/// `pointer` is NULL or memory from gm_alloc_pages, not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_free_pages(pointer: *mut c_void, length: gm_size_t) {
    guard("gm_free_pages", (), || {
        let _ = length;
        // SAFETY: as the caller promised.
        unsafe { libc::free(pointer) }
    });
}

/// The length of a NUL-terminated string.
///
/// # Safety
/// `string` points to a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strlen(string: *const c_char) -> gm_size_t {
    // SAFETY: as the caller promised.
    guard("gm_strlen", 0, || unsafe {
        libc::strlen(string) as gm_size_t
    })
}

/// Compares two strings as strcmp does.
///
/// # Safety
/// `a` and `b` point to NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strcmp(a: *const c_char, b: *const c_char) -> c_int {
    // SAFETY: as the caller promised.
    guard("gm_strcmp", 0, || unsafe { libc::strcmp(a, b) })
}

/// Compares at most `length` characters of two strings as strncmp does.
///
/// # Safety
/// `a` and `b` point to strings NUL-terminated or at least `length` long.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strncmp(a: *const c_char, b: *const c_char, length: c_int) -> c_int {
    // SAFETY: as the caller promised.
    guard("gm_strncmp", 0, || unsafe {
        libc::strncmp(a, b, length.max(0) as usize)
    })
}

/// As gm_strncmp, ignoring the case of ASCII letters.
///
/// # Safety
/// As gm_strncmp.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strncasecmp(
    a: *const c_char,
    b: *const c_char,
    length: c_int,
) -> c_int {
    // SAFETY: as the caller promised.
    guard("gm_strncasecmp", 0, || unsafe {
        libc::strncasecmp(a, b, length.max(0) as usize)
    })
}

/// Copies at most `length` characters of `from` to `to` as strncpy does; returns `to`.
///
/// # Safety
/// `from` is a string NUL-terminated or at least `length` long; `to` has room for `length`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strncpy(
    to: *mut c_char,
    from: *const c_char,
    length: c_int,
) -> *mut c_char {
    // SAFETY: as the caller promised.
    guard("gm_strncpy", to, || unsafe {
        libc::strncpy(to, from, length.max(0) as usize)
    })
}

/// A copy of `string` from gm_malloc (free it with gm_free); NULL if there is no memory.
///
/// # Safety
/// `string` points to a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_strdup(string: *const c_char) -> *mut c_char {
    // SAFETY: as the caller promised.
    guard("gm_strdup", core::ptr::null_mut(), || unsafe {
        libc::strdup(string)
    })
}

/// Nonzero if `c` is a printable ASCII character (space included), as isprint in the C locale.
#[unsafe(no_mangle)]
pub extern "C" fn gm_isprint(c: c_int) -> c_int {
    guard("gm_isprint", 0, || c_int::from((0x20..0x7f).contains(&c)))
}

/// The calling process's id.
#[unsafe(no_mangle)]
pub extern "C" fn gm_getpid() -> gm_pid_t {
    guard("gm_getpid", 0, std::process::id)
}

/// The base-2 logarithm of `n`, rounded up: the smallest k with 2^k >= n (0 for 0 and 1).
#[unsafe(no_mangle)]
pub extern "C" fn gm_log2_roundup(n: c_ulong) -> c_ulong {
    guard("gm_log2_roundup", 0, || {
        if n <= 1 {
            0
        } else {
            c_ulong::from(c_ulong::BITS - (n - 1).leading_zeros())
        }
    })
}

/// Seeds gm_rand.
#[unsafe(no_mangle)]
pub extern "C" fn gm_srand(seed: c_int) {
    guard("gm_srand", (), || {
        RANDOM.store(u64::from(seed as u32), Ordering::Relaxed);
    });
}

/// A pseudo-random number in 0..=0x7fffffff (a 64-bit linear congruential generator; the same
/// seed gives the same numbers). Not for cryptography.
#[unsafe(no_mangle)]
pub extern "C" fn gm_rand() -> c_int {
    guard("gm_rand", 0, || {
        let step = |state: u64| {
            state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407)
        };
        let previous = RANDOM
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |state| {
                Some(step(state))
            })
            .unwrap_or_default();
        (step(previous) >> 33) as c_int
    })
}

/// A pseudo-random number in 0..modulus (0 for modulus 0), from gm_rand.
#[unsafe(no_mangle)]
pub extern "C" fn gm_rand_mod(modulus: c_uint) -> c_uint {
    guard("gm_rand_mod", 0, || {
        if modulus == 0 {
            0
        } else {
            gm_rand() as c_uint % modulus
        }
    })
}

/// Prints `length` bytes at `pointer` in hex on standard output, 16 to a line, each line led by
/// its offset.
///
/// # Safety
/// `pointer` points to `length` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_hex_dump(pointer: *const c_void, length: gm_size_t) {
    guard("gm_hex_dump", (), || {
        if pointer.is_null() || length == 0 {
            return;
        }
        // SAFETY: as the caller promised.
        let bytes = unsafe { core::slice::from_raw_parts(pointer.cast::<u8>(), length as usize) };
        let mut out = std::io::stdout().lock();
        for (line, chunk) in bytes.chunks(16).enumerate() {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            let _ = writeln!(out, "{:08x}: {}", line * 16, hex.join(" "));
        }
    });
}

/// A mutex (GM's `struct gm_mutex`). Opaque: from gm_create_mutex, freed by gm_destroy_mutex.
pub struct gm_mutex {
    _opaque: [u8; 0],
}

/// What a `gm_mutex` handle points to.
struct GmMutex {
    held: std::sync::Mutex<bool>,
    released: std::sync::Condvar,
}

/// A new mutex, not held; NULL if there is no memory.
#[unsafe(no_mangle)]
pub extern "C" fn gm_create_mutex() -> *mut gm_mutex {
    guard("gm_create_mutex", core::ptr::null_mut(), || {
        Box::into_raw(Box::new(GmMutex {
            held: std::sync::Mutex::new(false),
            released: std::sync::Condvar::new(),
        }))
        .cast()
    })
}

/// Frees a mutex from gm_create_mutex; NULL is ignored.
///
/// # Safety
/// `mutex` is NULL or from gm_create_mutex, not held, used by no other thread, and not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_destroy_mutex(mutex: *mut gm_mutex) {
    guard("gm_destroy_mutex", (), || {
        if !mutex.is_null() {
            // SAFETY: it came from gm_create_mutex's Box and no one uses it (the caller's
            // promise).
            drop(unsafe { Box::from_raw(mutex.cast::<GmMutex>()) });
        }
    });
}

/// Takes the mutex, waiting while another thread holds it. Not recursive.
///
/// # Safety
/// `mutex` is from gm_create_mutex and not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_mutex_enter(mutex: *mut gm_mutex) {
    guard("gm_mutex_enter", (), || {
        // SAFETY: a live mutex from gm_create_mutex (the caller's promise).
        let Some(mutex) = (unsafe { mutex.cast::<GmMutex>().as_ref() }) else {
            return;
        };
        let mut held = mutex.held.lock().unwrap_or_else(PoisonError::into_inner);
        while *held {
            held = mutex
                .released
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *held = true;
    });
}

/// Releases the mutex taken with gm_mutex_enter.
///
/// # Safety
/// `mutex` is from gm_create_mutex, not freed, and held by this thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_mutex_exit(mutex: *mut gm_mutex) {
    guard("gm_mutex_exit", (), || {
        // SAFETY: a live mutex from gm_create_mutex (the caller's promise).
        let Some(mutex) = (unsafe { mutex.cast::<GmMutex>().as_ref() }) else {
            return;
        };
        *mutex.held.lock().unwrap_or_else(PoisonError::into_inner) = false;
        mutex.released.notify_one();
    });
}
