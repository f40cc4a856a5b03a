//! host-driver: device access for nicbar — opening ports, loading and flashing firmware.
//!
//! The backends that stand in for NIC hardware live here too: the deterministic simulator
//! ([`sim`]), which runs many copies of the real firmware core in one process over a simulated
//! wire in virtual time, and the emulated NIC (a daemon serving real processes over a real wire).
//! Each module owns one backend or one tool; they share only the firmware core and the ABI.

pub mod sim;
