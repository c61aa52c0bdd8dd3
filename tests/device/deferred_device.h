// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
//
// DeferredDevice: a host-memory Device for tests that behaves like a busy
// GPU. A host-to-device copy or a page-table patch does not run when it is
// enqueued: it runs when the test says so, or when a wait needs it, in
// enqueue order, reading its source at that time. So a staging byte the host
// overwrites before its copy has run reaches the "device", as it would on a
// GPU. Every Device call acts on one stream (the stream argument is ignored).
// It also counts its live allocations and events, for RAII tests, and can fail
// a copy on request.
//
// Thread safety: none; one test thread.
#ifndef KVBLOCK_TESTS_DEVICE_DEFERRED_DEVICE_H_
#define KVBLOCK_TESTS_DEVICE_DEFERRED_DEVICE_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "device/page_table_patch_reference.h"
#include "kvblock/device.h"

namespace kvblock::testing {

class DeferredDevice final : public Device {
 public:
  Kind kind() const override { return Kind::kHost; }
  std::string_view name() const override { return "deferred"; }

  // Host-to-device copies and patches enqueued and not yet run.
  int64_t pending_ops() const {
    return static_cast<int64_t>(ops_.size()) - ran_;
  }
  // Runs the pending copies up to the next recorded event that has not been
  // reached; false when there is none.
  bool RunToNextEvent() {
    const auto next =
        std::upper_bound(recorded_.begin(), recorded_.end(), ran_);
    if (next == recorded_.end()) return false;
    RunThrough(*next);
    return true;
  }
  // Makes the host-to-device copy after the next `n` fail (Internal), once.
  void FailCopyAfter(int64_t n) { copies_before_failure_ = n; }
  int64_t live_allocations() const { return live_allocations_; }
  int64_t live_events() const { return live_events_; }

  absl::Status CopyToHost(const void* src, void* dst, size_t bytes,
                          Stream /*stream*/) override {
    RunThrough(static_cast<int64_t>(ops_.size()));
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyDeviceToDevice(const void* src, void* dst, size_t bytes,
                                  Stream /*stream*/) override {
    RunThrough(static_cast<int64_t>(ops_.size()));
    if (bytes != 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize(Stream /*stream*/) override {
    RunThrough(static_cast<int64_t>(ops_.size()));
    return absl::OkStatus();
  }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  absl::Status RecordEvent(DeviceEvent& event, Stream /*stream*/) override {
    const int64_t position = static_cast<int64_t>(ops_.size());
    *Position(event) = position;
    if (recorded_.empty() || recorded_.back() != position) {
      recorded_.push_back(position);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventDone(const DeviceEvent& event) override {
    return *Position(event) <= ran_;
  }
  absl::Status WaitEvent(const DeviceEvent& event) override {
    RunThrough(*Position(event));
    return absl::OkStatus();
  }
  // One queue: its later work follows every event already.
  absl::Status StreamWaitEvent(Stream /*stream*/,
                               const DeviceEvent& /*event*/) override {
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override {
    ++live_allocations_;
    return std::calloc(1, bytes);
  }
  void FreeRaw(void* ptr) override {
    --live_allocations_;
    std::free(ptr);
  }
  absl::StatusOr<void*> AllocatePinnedRaw(size_t bytes) override {
    return AllocateRaw(bytes);
  }
  void FreePinnedRaw(void* ptr) override { FreeRaw(ptr); }
  // An event is the number of copies that precede it (0: never recorded).
  absl::StatusOr<void*> CreateEventRaw() override {
    ++live_events_;
    return static_cast<void*>(new int64_t(0));
  }
  void DestroyEventRaw(void* handle) override {
    --live_events_;
    delete static_cast<int64_t*>(handle);
  }
  absl::Status CopyToDeviceRaw(const void* src, void* dst, size_t bytes,
                               Stream /*stream*/) override {
    if (copies_before_failure_ >= 0 && copies_before_failure_-- == 0) {
      return absl::InternalError("deferred device: injected copy failure");
    }
    ops_.push_back({.src = src, .dst = dst, .bytes = bytes});
    return absl::OkStatus();
  }
  absl::Status ApplyPageTablePatchRaw(const PageTablePatch& patch,
                                      Stream /*stream*/) override {
    ops_.push_back({.patch = patch, .is_patch = true});
    return absl::OkStatus();
  }

 private:
  // A copy, or a patch (is_patch).
  struct Op {
    const void* src = nullptr;
    void* dst = nullptr;
    size_t bytes = 0;
    PageTablePatch patch = {};
    bool is_patch = false;
  };

  static int64_t* Position(const DeviceEvent& event) {
    return static_cast<int64_t*>(EventHandle(event));
  }
  void RunThrough(int64_t end) {
    for (; ran_ < end; ++ran_) {
      const Op& op = ops_[ran_];
      if (op.is_patch) {
        internal::ApplyPageTablePatchReference(op.patch);
      } else {
        std::memcpy(op.dst, op.src, op.bytes);
      }
    }
  }

  std::vector<Op> ops_;
  int64_t ran_ = 0;
  std::vector<int64_t> recorded_;       // increasing positions of RecordEvent.
  int64_t copies_before_failure_ = -1;  // -1: no failure planned.
  int64_t live_allocations_ = 0;
  int64_t live_events_ = 0;
};

}  // namespace kvblock::testing

#endif  // KVBLOCK_TESTS_DEVICE_DEFERRED_DEVICE_H_
