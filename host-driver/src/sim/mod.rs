//! The deterministic simulator: many NICs running the real firmware core in one process, over a
//! simulated wire in virtual time, with a seeded fault plan.
