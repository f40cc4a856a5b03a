//! The C events the library hands out: built here from what happened, in GM's layouts (every
//! field in network byte order, the type in the last byte).

use crate::types::*;

/// The network-order form of an address, as events carry it.
pub(crate) fn hton_pointer(pointer: usize) -> gm_up_n_t {
    gm_up_n_t {
        n: (pointer as u64).to_be(),
    }
}

/// An event with only its type set.
pub(crate) fn simple_event(kind: u8) -> gm_recv_event {
    gm_recv_event {
        sent: gm_sent_t {
            r#type: gm_u8_n_t { n: kind },
            ..gm_sent_t::default()
        },
    }
}

/// GM_FATAL_FIRMWARE_ERROR_EVENT with `status`.
pub(crate) fn fatal_event(status: gm_status_t) -> gm_recv_event {
    gm_recv_event {
        fatal_firmware_error: gm_fatal_firmware_error_t {
            status: gm_u32_n_t {
                n: (status as u32).to_be(),
            },
            r#type: gm_u8_n_t {
                n: GM_FATAL_FIRMWARE_ERROR_EVENT,
            },
            ..gm_fatal_firmware_error_t::default()
        },
    }
}

/// A receive buffer as its events describe it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BufferInfo {
    /// Its address in the program.
    pub(crate) address: usize,
    /// The program's tag.
    pub(crate) tag: u32,
    /// Its size class.
    pub(crate) size: u8,
}

/// A receive event of type `kind` (GM_RECV_EVENT, GM_HIGH_RECV_EVENT, GM_BAD_RECV_TOKEN_EVENT)
/// for `buffer`.
pub(crate) fn receive_event(
    kind: u8,
    buffer: BufferInfo,
    length: u32,
    sender_node: u16,
    sender_port: u8,
) -> gm_recv_event {
    gm_recv_event {
        recv: gm_recv_t {
            nicbar_tag: gm_u32_n_t {
                n: buffer.tag.to_be(),
            },
            message: hton_pointer(buffer.address),
            buffer: hton_pointer(buffer.address),
            length: gm_u32_n_t { n: length.to_be() },
            sender_node_id: gm_u16_n_t {
                n: sender_node.to_be(),
            },
            tag: gm_u8_n_t {
                n: buffer.tag as u8,
            },
            size: gm_u8_n_t { n: buffer.size },
            sender_port_id: gm_u8_n_t { n: sender_port },
            r#type: gm_u8_n_t { n: kind },
            ..gm_recv_t::default()
        },
    }
}

/// A barrier's end (GM_BARRIER_COMPLETED_EVENT or GM_BARRIER_FAILED_EVENT).
pub(crate) fn barrier_event(
    kind: u8,
    context: usize,
    status: gm_status_t,
    waiting_for: Option<(u16, u8)>,
) -> gm_recv_event {
    let (node, port) = waiting_for.unwrap_or((0, 0));
    gm_recv_event {
        barrier: gm_barrier_event_t {
            context: hton_pointer(context),
            status: gm_u32_n_t {
                n: (status as u32).to_be(),
            },
            waiting_for_node_id: gm_u16_n_t { n: node.to_be() },
            waiting_for_port_id: gm_u8_n_t { n: port },
            r#type: gm_u8_n_t { n: kind },
            ..gm_barrier_event_t::default()
        },
    }
}
