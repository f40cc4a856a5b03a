//! Opening a port for the collectives: the first free port of a NIC, or of the first of the
//! daemon's NICs that has one (a host's processes spread over its NICs by their local rank).

use shared_abi::ids::PORTS_PER_NIC;

use crate::{Error, Port};

/// Which NIC [`open_port`] opens a port of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// This NIC unit.
    Exactly(u8),
    /// The first unit that has a free port, from this one on (modulo the daemon's units).
    FirstFreeFrom(u32),
}

/// Why [`open_port`] opened no port.
#[derive(Debug)]
pub enum OpenError {
    /// Every port of `unit` is busy.
    Busy {
        /// The NIC unit.
        unit: u8,
    },
    /// Every port of every one of the daemon's `units` NICs is busy.
    AllBusy {
        /// How many NIC units the daemon runs.
        units: u8,
    },
    /// The daemon runs no NIC.
    NoUnits,
    /// The daemon refused or could not be reached.
    Port(Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy { unit } => write!(f, "every port of NIC unit {unit} is busy"),
            Self::AllBusy { units } => {
                write!(f, "every port of the daemon's {units} NIC unit(s) is busy")
            }
            Self::NoUnits => write!(f, "the NIC daemon runs no units"),
            Self::Port(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<Error> for OpenError {
    fn from(error: Error) -> Self {
        Self::Port(error)
    }
}

/// Opens a port of the local daemon (its socket: `$NICBAR_SOCKET`, else the default): the first
/// free one, from port 1 on (port 0 last), of `unit`.
///
/// # Errors
/// [`OpenError::Busy`] or [`OpenError::AllBusy`] when every port is taken,
/// [`OpenError::NoUnits`], or what the daemon says ([`OpenError::Port`]).
pub fn open_port(unit: Unit) -> Result<Port, OpenError> {
    match unit {
        Unit::Exactly(unit) => open_first_free(unit)?.ok_or(OpenError::Busy { unit }),
        Unit::FirstFreeFrom(start) => open_any(start),
    }
}

/// The first free port of `unit` (`None` if all are busy).
fn open_first_free(unit: u8) -> Result<Option<Port>, Error> {
    let ports = u8::try_from(PORTS_PER_NIC).unwrap_or(u8::MAX);
    for port in (1..ports).chain([0]) {
        match Port::open(unit, port) {
            Ok(port) => return Ok(Some(port)),
            Err(Error::PortBusy { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(None)
}

/// The first free port of the daemon's units, from unit `start` (modulo their number) on.
fn open_any(start: u32) -> Result<Port, OpenError> {
    // Ask for a unit past the daemon's last: the refusal says how many it runs.
    let units = match Port::open(u8::MAX, 1) {
        Err(Error::NoSuchUnit { units, .. }) => units,
        Ok(port) => return Ok(port),
        Err(other) => return Err(other.into()),
    };
    if units == 0 {
        return Err(OpenError::NoUnits);
    }
    let first = u8::try_from(start % u32::from(units)).unwrap_or(0);
    for offset in 0..units {
        let unit =
            u8::try_from((u32::from(first) + u32::from(offset)) % u32::from(units)).unwrap_or(0);
        if let Some(port) = open_first_free(unit)? {
            return Ok(port);
        }
    }
    Err(OpenError::AllBusy { units })
}
