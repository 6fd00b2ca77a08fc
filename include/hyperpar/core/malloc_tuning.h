#pragma once
// Keeps freed memory in the process for reuse (glibc malloc). By default glibc serves large
// blocks (activations, gradients: MiB each) with fresh mmap()s and returns them on free, so
// every step pays the page faults and zeroing of its activations again (~3% of CPU in a
// perf profile of an 8-rank step, more in one process). hyperpar-train calls this first:
// blocks up to 32 MiB (glibc's largest allowed mmap threshold) come from the heap, and the
// heap is not trimmed, so a step reuses the previous step's pages. Peak RSS grows slightly
// (freed blocks stay mapped until reused). HYPERPAR_MALLOC=default skips it.
namespace hyperpar {

/// Returns whether the settings were applied.
bool keep_freed_memory_for_reuse();

}  // namespace hyperpar
