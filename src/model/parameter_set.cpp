#include "src/model/parameter_set.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "src/core/error.h"

namespace grass {

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Rows and row length of a tensor's two layouts (a vector is one row).
struct RowLayout {
  int64_t hf_rows, hf_cols, pitch;
};
RowLayout row_layout(const ParamTensor& t) {
  if (t.shape.size() == 1) return {1, t.hf_shape[0], t.shape[0]};
  return {t.hf_shape[0], t.hf_shape[1], t.shape[1]};
}
}  // namespace

void ParameterSet::add(const std::string& name, std::vector<int64_t> hf_shape, bool is_norm,
                       std::vector<int64_t> stored, int layer) {
  if (stored.empty()) stored = hf_shape;
  GRASS_CHECK(stored.size() == hf_shape.size() && hf_shape.size() <= 2,
              "a parameter is a vector or a matrix: " + name);
  for (size_t i = 0; i < stored.size(); i++)
    GRASS_CHECK(stored[i] >= hf_shape[i], "a stored shape smaller than its tensor: " + name);
  ParamTensor t;
  t.name = name;
  t.numel = product(stored);
  t.shape = std::move(stored);
  t.offset = t.place_offset = num_stored_;
  t.is_norm = is_norm;
  t.layer = layer;
  t.grad_offset = num_dense_grads_;
  t.hf_numel = product(hf_shape);
  t.hf_shape = std::move(hf_shape);
  num_params_ += t.hf_numel;
  num_stored_ += t.numel;
  num_resident_ = num_stored_;
  num_dense_grads_ += t.numel;
  tensors_.push_back(std::move(t));
}

namespace {
// The first start at or after `cursor` congruent to `offset` modulo kPlaceAlign (offset >= cursor
// keeps it at or before offset).
int64_t place_at(int64_t cursor, int64_t offset) {
  constexpr int64_t a = ParameterSet::kPlaceAlign;
  return cursor + ((offset - cursor) % a + a) % a;
}
}  // namespace

void ParameterSet::stream_layers(const std::vector<int>& layers) {
  GRASS_CHECK(std::is_sorted(layers.begin(), layers.end()) &&
                  std::adjacent_find(layers.begin(), layers.end()) == layers.end(),
              "streamed layers must be ascending and distinct");
  streamed_layers_ = layers;
  num_resident_ = layer_block_ = 0;
  std::vector<int64_t> block_end(layers.size(), 0);
  for (ParamTensor& t : tensors_) {  // in flat order: each place's tensors keep their order
    const auto it = std::find(layers.begin(), layers.end(), t.layer);
    if (it == layers.end() || t.is_norm) {
      t.place = Place::Device;
      t.place_offset = place_at(num_resident_, t.offset);
      num_resident_ = t.place_offset + t.numel;
      continue;
    }
    t.place = Place::Streamed;
    int64_t& end = block_end[size_t(it - layers.begin())];
    t.place_offset = place_at(end, t.offset);
    end = t.place_offset + t.numel;
    layer_block_ = std::max(layer_block_, end);
  }
}

void hf_to_stored(const ParamTensor& t, const void* hf, void* stored, int elem_bytes) {
  const RowLayout r = row_layout(t);
  auto* out = static_cast<std::byte*>(stored);
  std::memset(out, 0, size_t(t.numel) * elem_bytes);
  for (int64_t i = 0; i < r.hf_rows; i++)
    std::memcpy(out + i * r.pitch * elem_bytes,
                static_cast<const std::byte*>(hf) + i * r.hf_cols * elem_bytes,
                size_t(r.hf_cols) * elem_bytes);
}

void stored_to_hf(const ParamTensor& t, const void* stored, void* hf, int elem_bytes) {
  const RowLayout r = row_layout(t);
  for (int64_t i = 0; i < r.hf_rows; i++)
    std::memcpy(static_cast<std::byte*>(hf) + i * r.hf_cols * elem_bytes,
                static_cast<const std::byte*>(stored) + i * r.pitch * elem_bytes,
                size_t(r.hf_cols) * elem_bytes);
}

void ParameterSet::set_projected(const std::vector<std::string>& names) {
  for (const std::string& name : names) index_of(name);  // each must exist
  num_dense_grads_ = 0;
  for (ParamTensor& t : tensors_) {
    const bool projected = std::find(names.begin(), names.end(), t.name) != names.end();
    t.grad_offset = projected ? -1 : num_dense_grads_;
    if (!projected) num_dense_grads_ += t.numel;
  }
}

int ParameterSet::index_of(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); i++)
    if (tensors_[i].name == name) return int(i);
  throw InternalError("no parameter named " + name);
}

}  // namespace grass
