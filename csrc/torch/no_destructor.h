// no_destructor.h - process-lifetime storage for the allocators' registries.
//
// Invariant: the object is constructed on first use and never destroyed, so
// tensors freed during interpreter shutdown (after static destructors ran)
// still find their arena.
#pragma once

#include <new>

namespace renaissance {

template <typename T>
class NoDestructor {
 public:
  NoDestructor() { ::new (static_cast<void*>(storage_)) T(); }
  NoDestructor(const NoDestructor&) = delete;
  NoDestructor& operator=(const NoDestructor&) = delete;
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace renaissance
