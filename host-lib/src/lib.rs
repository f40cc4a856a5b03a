//! host-lib: the nicbar user library.
//!
//! A process opens a port, allocates DMA buffers from the port's arena, posts send and receive
//! tokens into the port's memory-mapped rings, and polls events — no system call per message.
