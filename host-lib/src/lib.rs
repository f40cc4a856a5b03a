//! host-lib
