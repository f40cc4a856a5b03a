//! Compilers from barrier algorithms to schedules (pairwise exchange, gather-broadcast, n-way
//! dissemination).
