//! Byte order: GM's `gm_ntoh_*` and `gm_hton_*` accessors for the network-order fields of events.
//!
//! Written out one by one rather than by a macro so that the header generator sees each of them.

use core::ffi::c_void;

use super::guard;
use crate::types::*;

/// Reads a unsigned 8-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_u8(value: gm_u8_n_t) -> gm_u8_t {
    guard("gm_ntoh_u8", 0, || u8::from_be(value.n))
}

/// Makes a unsigned 8-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_u8(value: gm_u8_t) -> gm_u8_n_t {
    guard("gm_hton_u8", gm_u8_n_t::default(), || gm_u8_n_t {
        n: value.to_be(),
    })
}

/// Reads a unsigned 16-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_u16(value: gm_u16_n_t) -> gm_u16_t {
    guard("gm_ntoh_u16", 0, || u16::from_be(value.n))
}

/// Makes a unsigned 16-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_u16(value: gm_u16_t) -> gm_u16_n_t {
    guard("gm_hton_u16", gm_u16_n_t::default(), || gm_u16_n_t {
        n: value.to_be(),
    })
}

/// Reads a unsigned 32-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_u32(value: gm_u32_n_t) -> gm_u32_t {
    guard("gm_ntoh_u32", 0, || u32::from_be(value.n))
}

/// Makes a unsigned 32-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_u32(value: gm_u32_t) -> gm_u32_n_t {
    guard("gm_hton_u32", gm_u32_n_t::default(), || gm_u32_n_t {
        n: value.to_be(),
    })
}

/// Reads a unsigned 64-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_u64(value: gm_u64_n_t) -> gm_u64_t {
    guard("gm_ntoh_u64", 0, || u64::from_be(value.n))
}

/// Makes a unsigned 64-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_u64(value: gm_u64_t) -> gm_u64_n_t {
    guard("gm_hton_u64", gm_u64_n_t::default(), || gm_u64_n_t {
        n: value.to_be(),
    })
}

/// Reads a signed 8-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_s8(value: gm_s8_n_t) -> gm_s8_t {
    guard("gm_ntoh_s8", 0, || i8::from_be(value.n))
}

/// Makes a signed 8-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_s8(value: gm_s8_t) -> gm_s8_n_t {
    guard("gm_hton_s8", gm_s8_n_t::default(), || gm_s8_n_t {
        n: value.to_be(),
    })
}

/// Reads a signed 16-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_s16(value: gm_s16_n_t) -> gm_s16_t {
    guard("gm_ntoh_s16", 0, || i16::from_be(value.n))
}

/// Makes a signed 16-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_s16(value: gm_s16_t) -> gm_s16_n_t {
    guard("gm_hton_s16", gm_s16_n_t::default(), || gm_s16_n_t {
        n: value.to_be(),
    })
}

/// Reads a signed 32-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_s32(value: gm_s32_n_t) -> gm_s32_t {
    guard("gm_ntoh_s32", 0, || i32::from_be(value.n))
}

/// Makes a signed 32-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_s32(value: gm_s32_t) -> gm_s32_n_t {
    guard("gm_hton_s32", gm_s32_n_t::default(), || gm_s32_n_t {
        n: value.to_be(),
    })
}

/// Reads a signed 64-bit field in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntoh_s64(value: gm_s64_n_t) -> gm_s64_t {
    guard("gm_ntoh_s64", 0, || i64::from_be(value.n))
}

/// Makes a signed 64-bit value in network byte order.
#[unsafe(no_mangle)]
pub extern "C" fn gm_hton_s64(value: gm_s64_t) -> gm_s64_n_t {
    guard("gm_hton_s64", gm_s64_n_t::default(), || gm_s64_n_t {
        n: value.to_be(),
    })
}

/// GM 1's name for gm_ntoh_u8.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntohc(value: gm_u8_n_t) -> gm_u8_t {
    guard("gm_ntohc", 0, || gm_ntoh_u8(value))
}

/// GM 1's name for gm_hton_u8.
#[unsafe(no_mangle)]
pub extern "C" fn gm_htonc(value: gm_u8_t) -> gm_u8_n_t {
    guard("gm_htonc", gm_u8_n_t::default(), || gm_hton_u8(value))
}

/// GM 1's name for gm_ntoh_u16.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntohs(value: gm_u16_n_t) -> gm_u16_t {
    guard("gm_ntohs", 0, || gm_ntoh_u16(value))
}

/// GM 1's name for gm_hton_u16.
#[unsafe(no_mangle)]
pub extern "C" fn gm_htons(value: gm_u16_t) -> gm_u16_n_t {
    guard("gm_htons", gm_u16_n_t::default(), || gm_hton_u16(value))
}

/// GM 1's name for gm_ntoh_u32.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntohl(value: gm_u32_n_t) -> gm_u32_t {
    guard("gm_ntohl", 0, || gm_ntoh_u32(value))
}

/// GM 1's name for gm_hton_u32.
#[unsafe(no_mangle)]
pub extern "C" fn gm_htonl(value: gm_u32_t) -> gm_u32_n_t {
    guard("gm_htonl", gm_u32_n_t::default(), || gm_hton_u32(value))
}

/// GM 1's name for gm_ntoh_u64.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntohll(value: gm_u64_n_t) -> gm_u64_t {
    guard("gm_ntohll", 0, || gm_ntoh_u64(value))
}

/// GM 1's name for gm_hton_u64.
#[unsafe(no_mangle)]
pub extern "C" fn gm_htonll(value: gm_u64_t) -> gm_u64_n_t {
    guard("gm_htonll", gm_u64_n_t::default(), || gm_hton_u64(value))
}

/// Reads a user virtual address field (`recv.buffer`, `recv.message`, `barrier.context`) as a
/// pointer.
#[unsafe(no_mangle)]
pub extern "C" fn gm_ntohp(value: gm_up_n_t) -> *mut c_void {
    // An address this process gave the library, handed back: only its integer value travels.
    guard("gm_ntohp", core::ptr::null_mut(), || {
        u64::from_be(value.n) as usize as *mut c_void
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::hton_pointer;

    #[test]
    fn network_order_is_big_endian_and_round_trips() {
        assert_eq!(gm_hton_u32(0x0102_0304).n.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(gm_hton_u16(0x0102).n.to_ne_bytes(), [1, 2]);
        assert_eq!(gm_ntoh_u32(gm_hton_u32(0xdead_beef)), 0xdead_beef);
        assert_eq!(gm_ntoh_s16(gm_hton_s16(-2)), -2);
        assert_eq!(gm_ntoh_u64(gm_hton_u64(u64::MAX - 5)), u64::MAX - 5);
        assert_eq!(gm_ntohl(gm_htonl(7)), 7);
        let x = 5u8;
        let pointer = core::ptr::addr_of!(x) as usize;
        assert_eq!(gm_ntohp(hton_pointer(pointer)) as usize, pointer);
    }
}
