// A key-value store of immutable byte objects, as a capture sink needs one: put a whole
// object (visible to readers at once, or not at all) and put a small one. The Mooncake
// client implements it; tests put a map behind it.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "util/status.h"

namespace hsx {

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Stores `nbytes` bytes under `key`: `fill` writes them into memory the store lends (for
  // Mooncake, a buffer registered with its transfer engine, so the bytes are copied once).
  // Blocks while every buffer is lent; called from several threads at once.
  virtual Status PutWith(const std::string& key, size_t nbytes,
                         const std::function<void(std::span<std::byte>)>& fill) = 0;
  // Stores a small object (an error marker) from the caller's memory.
  virtual Status Put(const std::string& key, std::string_view bytes) = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace hsx
