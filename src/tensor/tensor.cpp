#include "tensor/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cassert>
#include <new>
#include <cstdlib>
#include <cstring>

namespace hsx {

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t ShapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<int64_t> CheckedShapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

Tensor Tensor::Host(DType dtype, Shape shape) {
  const size_t bytes = std::max<size_t>(64, static_cast<size_t>(ShapeNumel(shape)) * DTypeSize(dtype));
  std::shared_ptr<void> owner;
  if (bytes >= (1u << 20)) {
    // Large buffers (KV caches, captures) come from mmap: zeroed pages, committed only when touched.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Huge pages where the kernel offers them: a multi-GB capture touched for the first
    // time takes 512x fewer page faults (the advice is only a hint; failure is harmless).
    if (bytes >= (2u << 20)) ::madvise(p, bytes, MADV_HUGEPAGE);
    owner = std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
  } else {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    owner = std::shared_ptr<void>(p, std::free);
  }
  void* data = owner.get();
  return Tensor(data, dtype, std::move(shape), Device::kCPU, std::move(owner));
}

Tensor Tensor::View(Shape shape) const {
  assert(ShapeNumel(shape) == numel());
  Tensor t(data_, dtype_, std::move(shape), device_, owner_);
  if (row_scales_ && t.dim() >= 1 && t.shape_[0] == shape_[0]) t.row_scales_ = row_scales_;
  return t;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  assert(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  int64_t row_elems = 1;
  for (int d = 1; d < dim(); ++d) row_elems *= shape_[d];
  Shape s = shape_;
  s[0] = end - begin;
  char* p = static_cast<char*>(data_) + begin * row_elems * static_cast<int64_t>(DTypeSize(dtype_));
  Tensor t(p, dtype_, std::move(s), device_, owner_);
  if (row_scales_) t.row_scales_ = std::make_shared<const Tensor>(row_scales_->Rows(begin, end));
  return t;
}

Tensor Tensor::WithRowScales(Tensor scales) const {
  assert(scales.dtype() == DType::kF32 && scales.numel() == shape_[0]);
  Tensor t = *this;
  t.row_scales_ = std::make_shared<const Tensor>(std::move(scales));
  return t;
}

}  // namespace hsx
