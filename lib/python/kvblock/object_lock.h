// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// ObjectLock: one Python thread at a time inside a bound object. The core is
// thread-compatible, and the bindings release the GIL in calls whose work
// grows with a prompt or a batch, so without a lock a second thread could
// enter a BlockManager (or its BatchCommit, or their KVPageTable) in the
// middle of a call. Every method of these objects takes the object's lock
// first: a second thread waits for the first call to finish, and a call
// never sees another half done.
//
// No deadlock with the GIL: a thread never waits for the lock while it holds
// the GIL (it releases the GIL first), so the thread holding the lock always
// gets the GIL back. A re-entry from the thread that holds the lock (a
// finalizer run inside a call) cannot wait for itself: it raises
// FailedPreconditionError. Objects locked together are locked in one order:
// the manager before the table. A call that holds a table's lock alone makes
// no Python object (its result, an exception) until it lets go: a collection
// there could run the finalizer of a commit over another table, which takes
// that commit's manager's lock, the other order.
#ifndef KVBLOCK_LIB_PYTHON_KVBLOCK_OBJECT_LOCK_H_
#define KVBLOCK_LIB_PYTHON_KVBLOCK_OBJECT_LOCK_H_

#include <pybind11/pybind11.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "status_error.h"
#include "strict_int.h"

namespace kvblock::python {

class ObjectMutex {
 public:
  // Whether the calling thread is inside a call that holds it.
  bool HeldByThisThread() const {
    return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

 private:
  friend class ObjectLock;
  std::mutex mutex_;
  // The thread inside, read only to refuse its own re-entry.
  std::atomic<std::thread::id> owner_{};
};

class ObjectLock {
 public:
  // REQUIRES: the GIL is held. `what` names the object in the re-entry
  // error.
  ObjectLock(ObjectMutex& mutex, const char* what) : mutex_(mutex) {
    if (mutex_.HeldByThisThread()) {
      Raise(absl::FailedPreconditionError(
          std::string("kvblock: a call on the ") + what +
          " was made from inside another call on it, on the same thread (a "
          "finalizer?); it is refused"));
    }
    if (!mutex_.mutex_.try_lock()) {
      pybind11::gil_scoped_release release;
      mutex_.mutex_.lock();
    }
    mutex_.owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  ~ObjectLock() {
    mutex_.owner_.store(std::thread::id(), std::memory_order_relaxed);
    mutex_.mutex_.unlock();
  }
  ObjectLock(const ObjectLock&) = delete;
  ObjectLock& operator=(const ObjectLock&) = delete;

 private:
  ObjectMutex& mutex_;
};

}  // namespace kvblock::python

#endif  // KVBLOCK_LIB_PYTHON_KVBLOCK_OBJECT_LOCK_H_
