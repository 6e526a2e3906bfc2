#include "src/model/x_in_ring.h"

#include <algorithm>

#include "src/core/error.h"

namespace grass {

XInRing::XInRing(Backend& backend, Arena& arena, int layers, int64_t bytes, ActivationOffload where,
                 const std::string& disk_dir)
    : backend_(backend), layers_(layers), bytes_(bytes), where_(where),
      out_mark_(size_t(layers)), stored_mark_(size_t(layers)), in_mark_(size_t(layers)) {
  GRASS_CHECK(where != ActivationOffload::None, "an x_in ring with nowhere to send the inputs");
  for (int s = 0; s < std::min(kSlots, layers); s++)
    slots_.push_back(arena.alloc_bytes(MemCategory::Workspace,
                                       "layer input ring slot " + std::to_string(s), bytes));
  if (layers_out() == 0) return;
  if (where == ActivationOffload::Host) {
    host_ = static_cast<char*>(arena.alloc_bytes(
        MemCategory::Activations,
        "layer inputs 0.." + std::to_string(layers_out() - 1) + " (offload.activations host)",
        int64_t(layers_out()) * bytes, MemPlace::Host));
    return;
  }
  const int64_t stride = ActivationFile::stride_for(bytes);
  char* raw = static_cast<char*>(arena.alloc_bytes(
      MemCategory::Workspace, "layer input bounce buffer (offload.activations disk)",
      stride + ActivationFile::kAlign, MemPlace::Host));
  disk_bytes_ = stride * layers_out();
  if (arena.planning()) return;
  const auto at = reinterpret_cast<uintptr_t>(raw);
  bounce_ = raw + (ActivationFile::kAlign - at % ActivationFile::kAlign) % ActivationFile::kAlign;
  file_ = std::make_unique<ActivationFile>(disk_dir, layers_out(), bytes);
}

void XInRing::before_write(int l) {
  const int previous = l - kSlots;  // the slot's last occupant in this forward
  if (previous >= 0 && leaves(previous)) backend_.wait_copies(out_mark_[size_t(previous)]);
}

void XInRing::after_forward(int l, int64_t bytes) {
  if (!leaves(l)) return;
  constexpr Backend::Copy kOut = Backend::Copy::ToHost;
  if (where_ == ActivationOffload::Host) {
    backend_.copy_async(host_ + int64_t(l) * bytes_, slot(l), size_t(bytes), kOut);
    out_mark_[size_t(l)] = stored_mark_[size_t(l)] = backend_.mark_copies(kOut);
    return;
  }
  backend_.copy_async(bounce_, slot(l), size_t(bytes), kOut);
  out_mark_[size_t(l)] = backend_.mark_copies(kOut);  // the slot is free; the write follows
  ActivationFile* file = file_.get();
  char* bounce = bounce_;
  backend_.copy_queue_task(kOut, [file, bounce, l, bytes] { file->write(l, bounce, bytes); },
                           bounce_, size_t(ActivationFile::stride_for(bytes)));
  stored_mark_[size_t(l)] = backend_.mark_copies(kOut);
}

void XInRing::fetch(int l, int64_t bytes) {
  constexpr Backend::Copy kIn = Backend::Copy::ToDevice;
  backend_.order_copy_after(stored_mark_[size_t(l)]);
  if (where_ == ActivationOffload::Host) {
    backend_.copy_async(slot(l), host_ + int64_t(l) * bytes_, size_t(bytes), kIn);
  } else {
    ActivationFile* file = file_.get();
    char* bounce = bounce_;
    backend_.copy_queue_task(kIn, [file, bounce, l, bytes] { file->read(l, bounce, bytes); },
                             nullptr, 0);
    backend_.copy_async(slot(l), bounce_, size_t(bytes), kIn);
  }
  in_mark_[size_t(l)] = backend_.mark_copies(kIn);
}

void XInRing::before_backward(int l, int64_t bytes) {
  if (leaves(l)) {
    // layer l + kSlots - 1's backward (at most the last but one layer's) fetched it
    GRASS_CHECK(in_mark_[size_t(l)].n != 0, "a layer input the backward did not fetch ahead");
    backend_.wait_copies(in_mark_[size_t(l)]);
    in_mark_[size_t(l)] = {};
  }
  const int next = l - kSlots + 1;  // into slot(l + 1), whose backward is queued
  if (next >= 0 && leaves(next) && in_mark_[size_t(next)].n == 0) fetch(next, bytes);
}

void XInRing::throw_if_failed() const {
  if (file_) file_->throw_if_failed();
}

}  // namespace grass
