//! The figures the paper's text states (§6 and the abstract): what [`super::params`] fits the
//! costs to and what [`super::paper`] scores the model's predictions against.
//!
//! Only numbers the text states are here; Figure 5's curves are not legible in the project's copy.

/// §6: LANai 7.2, eight nodes, NIC-based pairwise exchange, µs. Fitted.
pub const LANAI72_PE8_NIC_US: f64 = 49.25;
/// §6: LANai 7.2, eight nodes, host-based pairwise exchange, µs. Fitted.
pub const LANAI72_PE8_HOST_US: f64 = 90.24;
/// §6: LANai 4.3, eight nodes, pairwise exchange factor of improvement. Fitted.
pub const LANAI43_PE8_FACTOR: f64 = 1.66;
/// Abstract, §1, §6: LANai 4.3, 16 nodes, NIC-based pairwise exchange, µs. Predicted.
pub const LANAI43_PE16_NIC_US: f64 = 102.14;
/// Abstract, §6: LANai 4.3, 16 nodes, pairwise exchange factor. Predicted.
pub const LANAI43_PE16_FACTOR: f64 = 1.78;
/// §6: LANai 4.3, 16 nodes, NIC-based gather-broadcast (best dimension), µs. Predicted.
pub const LANAI43_GB16_NIC_US: f64 = 152.27;
/// §6: LANai 4.3, 16 nodes, gather-broadcast factor. Predicted.
pub const LANAI43_GB16_FACTOR: f64 = 1.46;
