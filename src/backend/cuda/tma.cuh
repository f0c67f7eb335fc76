// Hopper's tensor memory accelerator (TMA, sm_90 PTX) and what a warp-specialized kernel
// builds on it: transaction-counting shared-memory barriers (mbarrier), named barriers
// and moving registers from one warpgroup to another (setmaxnreg).
// A TMA copy is one instruction from one thread for a whole box of a tensor, written to
// shared memory in the swizzled layout the wgmma descriptors read (wgmma.cuh); its bytes
// complete a barrier's phase, so consumers wait for data without any thread copying it.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

namespace hsx::cuda::tma {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A barrier whose phase completes after `arrivals` arrivals (and, for a phase given an
// expected byte count, once those bytes have landed).
__device__ __forceinline__ void InitBarrier(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(arrivals) : "memory");
}
// Makes barrier initializations visible to TMA (the async proxy) before its first copy.
__device__ __forceinline__ void FenceBarrierInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also tells the phase to wait for `bytes` more of TMA data.
__device__ __forceinline__ void ArriveExpectingBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void Arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(bar)) : "memory");
}
// Waits for the completion of the phase with this parity (phases alternate 0, 1, 0, ...;
// a fresh barrier is in phase 0, so waiting for parity 1 returns at once).
__device__ __forceinline__ void Wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// Copies the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory
// (dst 128-byte aligned; 1024 for the 128-byte swizzle), completing its bytes on bar.
__device__ __forceinline__ void Load3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(SharedAddress(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(SharedAddress(bar))
      : "memory");
}

// Named barrier `id` (1-15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void SyncNamed(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-thread register budgets of a warpgroup (a multiple of 8 in [24, 256]); every thread
// of the warpgroup executes it. Loaders give registers up, so that the math warpgroups can
// hold their accumulators.
template <int kRegisters>
__device__ __forceinline__ void ReleaseRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void ClaimRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace hsx::cuda::tma
