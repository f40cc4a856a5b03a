//! A port's DMA memory as GM's programs see it: a heap of whole pages from the port's arena.
//!
//! GM's `gm_dma_malloc` carves page-granular pieces out of memory the NIC may write anywhere in,
//! and a receive buffer is good if the bytes its size class can hold lie in that memory, not
//! necessarily inside the one allocation the pointer came from (a 64-byte allocation offered at
//! size class 7, which holds 120 bytes, works on GM: the allocation's page holds them). So the
//! heap hands out whole pages and checks a buffer against the pages it covers, which may be
//! several adjacent allocations; each of them is held while the NIC holds the buffer, so freeing
//! one of them then cannot give its bytes to anyone else. A range that runs into memory the
//! program did not allocate (the library's own DMA memory, another port's mapping, unmapped
//! space) is refused: the NIC never writes outside the program's DMA memory of this port.

use std::collections::BTreeMap;

/// GM's page: allocations are whole multiples of it (GM's `GM_PAGE_LEN`).
pub(crate) const DMA_PAGE_LEN: usize = 4096;

/// `length` bytes rounded up to whole pages (at least one); `None` if that overflows.
pub(crate) fn page_rounded(length: usize) -> Option<usize> {
    length.max(1).checked_next_multiple_of(DMA_PAGE_LEN)
}

/// One allocation: what keeps its bytes (the arena buffer), how long it is, and who holds it.
#[derive(Debug)]
struct Allocation<B> {
    buffer: B,
    len: usize,
    /// Buffers the NIC holds that cover this allocation.
    in_flight: u32,
    /// gm_dma_free was called while the NIC held it: freed when the last one comes back.
    freed: bool,
}

/// Where a buffer lies in the heap: the allocations it covers (by start address, in order) and
/// the address it starts at, which the caller turns into an arena offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Covered {
    /// The start of each allocation the range covers.
    pub(crate) allocations: Vec<usize>,
    /// The start of the first one.
    pub(crate) first: usize,
}

/// The allocations of a port's DMA heap, by start address. `B` keeps the bytes (an arena buffer,
/// dropped to give them back); adjacent addresses are adjacent in the arena.
#[derive(Debug)]
pub(crate) struct DmaHeap<B> {
    allocations: BTreeMap<usize, Allocation<B>>,
}

impl<B> Default for DmaHeap<B> {
    fn default() -> Self {
        Self {
            allocations: BTreeMap::new(),
        }
    }
}

impl<B> DmaHeap<B> {
    /// Records `len` bytes at `address`, kept by `buffer`.
    pub(crate) fn insert(&mut self, address: usize, len: usize, buffer: B) {
        self.allocations.insert(
            address,
            Allocation {
                buffer,
                len,
                in_flight: 0,
                freed: false,
            },
        );
    }

    /// The buffer of the live allocation starting at `address`, if there is one.
    pub(crate) fn buffer(&self, address: usize) -> Option<&B> {
        self.allocations
            .get(&address)
            .filter(|allocation| !allocation.freed)
            .map(|allocation| &allocation.buffer)
    }

    /// Finds the allocations that hold `[address, address + len)`: the range must start inside
    /// a live allocation and run through live allocations that follow each other without a gap.
    ///
    /// # Errors
    /// Why not, in words naming the range and where it leaves the program's DMA memory.
    pub(crate) fn cover(&self, address: usize, len: usize) -> Result<Covered, String> {
        let end = address
            .checked_add(len)
            .ok_or_else(|| format!("{address:#x} + {len} bytes wraps around"))?;
        let outside = |at: usize| {
            format!(
                "{len} bytes at {address:#x} are not inside DMA memory of this port from \
                 gm_dma_malloc (the memory at {at:#x} is not)"
            )
        };
        let (&first, allocation) = self
            .allocations
            .range(..=address)
            .next_back()
            .filter(|(start, allocation)| {
                !allocation.freed
                    && (address < *start + allocation.len
                        || (len == 0 && address == *start + allocation.len))
            })
            .ok_or_else(|| outside(address))?;
        let mut allocations = vec![first];
        let mut covered = first + allocation.len;
        while covered < end {
            match self.allocations.get(&covered) {
                Some(next) if !next.freed => {
                    allocations.push(covered);
                    covered += next.len;
                }
                _ => return Err(outside(covered)),
            }
        }
        Ok(Covered { allocations, first })
    }

    /// The NIC took a buffer covering `allocations`.
    pub(crate) fn hold(&mut self, allocations: &[usize]) {
        for start in allocations {
            if let Some(allocation) = self.allocations.get_mut(start) {
                allocation.in_flight += 1;
            }
        }
    }

    /// The NIC gave back a buffer covering `allocations`; frees those the program already did.
    pub(crate) fn release(&mut self, allocations: &[usize]) {
        for start in allocations {
            if let Some(allocation) = self.allocations.get_mut(start) {
                allocation.in_flight = allocation.in_flight.saturating_sub(1);
                if allocation.freed && allocation.in_flight == 0 {
                    self.allocations.remove(start);
                }
            }
        }
    }

    /// gm_dma_free: frees the allocation starting at `address`, now or when the NIC gives back
    /// the last buffer covering it.
    ///
    /// # Errors
    /// Why `address` is not the start of a live allocation.
    pub(crate) fn free(&mut self, address: usize) -> Result<(), String> {
        match self.allocations.get_mut(&address) {
            Some(allocation) if !allocation.freed => {
                if allocation.in_flight == 0 {
                    self.allocations.remove(&address);
                } else {
                    allocation.freed = true;
                }
                Ok(())
            }
            _ => Err(format!(
                "gm_dma_free: {address:#x} is not DMA memory of this port from gm_dma_malloc"
            )),
        }
    }

    /// Live (not freed) allocations.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.allocations.values().filter(|a| !a.freed).count()
    }

    /// Allocations kept, freed ones the NIC still holds included.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.allocations.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = DMA_PAGE_LEN;
    const BASE: usize = 0x10_0000;

    /// Three adjacent one-page allocations, then a gap, then one more.
    fn heap() -> DmaHeap<()> {
        let mut heap = DmaHeap::default();
        for page in [0, 1, 2, 4] {
            heap.insert(BASE + page * PAGE, PAGE, ());
        }
        heap
    }

    #[test]
    fn allocations_are_whole_pages() {
        assert_eq!(page_rounded(0), Some(PAGE));
        assert_eq!(page_rounded(1), Some(PAGE));
        assert_eq!(page_rounded(8), Some(PAGE));
        assert_eq!(page_rounded(PAGE), Some(PAGE));
        assert_eq!(page_rounded(PAGE + 1), Some(2 * PAGE));
        assert_eq!(page_rounded(usize::MAX), None);
    }

    #[test]
    fn a_buffer_may_run_past_its_allocation_into_the_next_but_not_out_of_the_heap() {
        let heap = heap();
        // Exact and short: the page holds it.
        assert_eq!(heap.cover(BASE, 8).unwrap().allocations, vec![BASE]);
        assert_eq!(heap.cover(BASE + 64, 120).unwrap().allocations, vec![BASE]);
        // Across adjacent allocations.
        let covered = heap.cover(BASE + PAGE - 8, 16).unwrap();
        assert_eq!(covered.allocations, vec![BASE, BASE + PAGE]);
        assert_eq!(covered.first, BASE);
        assert_eq!(
            heap.cover(BASE, 3 * PAGE).unwrap().allocations,
            vec![BASE, BASE + PAGE, BASE + 2 * PAGE]
        );
        // Into the gap, before the heap, and wrapping around: refused, naming where.
        let gap = heap.cover(BASE + 2 * PAGE, PAGE + 1).unwrap_err();
        assert!(
            gap.contains(&format!("{:#x} is not", BASE + 3 * PAGE)),
            "{gap}"
        );
        assert!(heap.cover(BASE - 1, 2).is_err());
        assert!(
            heap.cover(BASE + 3 * PAGE, 0).is_ok(),
            "an empty range at an end"
        );
        assert!(heap.cover(BASE + 3 * PAGE + 1, 0).is_err());
        assert!(heap.cover(usize::MAX, 2).unwrap_err().contains("wraps"));
    }

    #[test]
    fn freed_memory_the_nic_holds_is_kept_until_it_comes_back_and_covers_nothing_new() {
        let mut heap = heap();
        let covered = heap.cover(BASE + PAGE - 8, 16).unwrap();
        heap.hold(&covered.allocations);
        heap.free(BASE + PAGE).unwrap();
        assert_eq!(heap.live(), 3);
        assert_eq!(heap.kept(), 4, "the NIC still holds the freed page");
        // A freed page ends the program's DMA memory for new buffers, and cannot be freed twice.
        assert!(heap.cover(BASE, PAGE + 1).is_err());
        assert!(heap.free(BASE + PAGE).is_err());
        assert!(heap.buffer(BASE + PAGE).is_none());
        heap.release(&covered.allocations);
        assert_eq!(heap.kept(), 3, "given back once the NIC let go");
        heap.free(BASE).unwrap();
        assert_eq!(heap.kept(), 2);
        assert!(
            heap.free(BASE + 17).is_err(),
            "not the start of an allocation"
        );
    }
}
