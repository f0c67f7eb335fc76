// A typed, shaped view of memory on a device. Storage is shared: views and row slices
// keep the owner alive (a mmapped checkpoint, a host allocation, a device allocation).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace hsx {

enum class Device : uint8_t { kCPU, kCUDA };

using Shape = std::vector<int64_t>;

std::string ShapeToString(const Shape& shape);
// Elements of a shape hsx built or validated (no overflow check).
int64_t ShapeNumel(const Shape& shape);
// Elements of an untrusted shape; nullopt if a dimension is negative or the product
// overflows int64 (a file's header may claim anything).
std::optional<int64_t> CheckedShapeNumel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape, Device device, std::shared_ptr<void> owner)
      : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device), owner_(std::move(owner)) {}

  // Zero-filled, 64-byte aligned host memory.
  static Tensor Host(DType dtype, Shape shape);

  bool defined() const { return data_ != nullptr || !shape_.empty(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_[d < 0 ? d + dim() : d]; }
  int64_t numel() const { return ShapeNumel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw() const { return data_; }
  template <class T>
  T* data() const { return static_cast<T*>(data_); }

  // Same storage, new shape with the same element count.
  Tensor View(Shape shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor Rows(int64_t begin, int64_t end) const;

  // FP8 weights carry one f32 scale per row (first dimension): row r stands for its
  // elements times (*row_scales())[r]. Rows() slices the scales; a View keeping the
  // first dimension keeps them.
  const Tensor* row_scales() const { return row_scales_.get(); }
  Tensor WithRowScales(Tensor scales) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_ = Device::kCPU;
  std::shared_ptr<void> owner_;
  std::shared_ptr<const Tensor> row_scales_;
};

}  // namespace hsx
