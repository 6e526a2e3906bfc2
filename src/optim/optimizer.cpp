#include "src/optim/optimizer.h"

#include <climits>
#include <cstdio>

#include "kernels/quant8.h"
#include "src/core/error.h"
#include "src/optim/state_slots.h"

namespace grass {

using nlohmann::json;

void* Optimizer::slots_device(const void* at) const { return slots_->device(at); }

void Optimizer::update_elements(int tensor, void* g, const double* clip, double lr, int64_t first,
                                int64_t count) {
  (void)tensor, (void)g, (void)clip, (void)lr, (void)first, (void)count;
  GRASS_CHECK(false, std::string(name()) + " updates whole tensors only");
}

const json& StateReader::field(const json& obj, const std::string& key,
                               const std::string& where) const {
  if (!obj.is_object() || !obj.contains(key)) fail(where + key + " is missing");
  return obj[key];
}

uint64_t StateReader::u64(const json& obj, const std::string& key, const std::string& where) const {
  const json& v = field(obj, key, where);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(INT64_MAX))
    fail(where + key + " is not a non-negative integer");
  return v.get<uint64_t>();
}

bool StateReader::boolean(const json& obj, const std::string& key, const std::string& where) const {
  const json& v = field(obj, key, where);
  if (!v.is_boolean()) fail(where + key + " is not true or false");
  return v.get<bool>();
}

void StateReader::target_list(const json& saved, const std::string& key,
                              const std::vector<std::string>& tensors,
                              const std::string& what) const {
  if (!saved.is_array() || saved.size() != tensors.size())
    fail(key + " does not list this run's " + std::to_string(tensors.size()) + " " + what +
         " targets" + kMismatch);
  for (size_t k = 0; k < tensors.size(); k++) {
    const std::string where = key + "[" + std::to_string(k) + "].";
    const json& tensor = field(saved[k], "tensor", where);
    if (!tensor.is_string() || tensor.get_ref<const std::string&>() != tensors[k])
      fail(where + "tensor is " + tensor.dump() + ", this run's target is " + tensors[k] +
           kMismatch);
    u64(saved[k], "adam_step", where);
  }
}

std::string state_format(const OptimizerConfig& cfg, const Storage& storage) {
  const char* plain = storage.pure_bf16() ? "bf16" : "fp32";  // the CPU rounds to bf16 in fp32 memory
  if (cfg.state_dtype != StateDtype::Q8) return plain;
  const std::string blocking =
      is_projected(cfg.kind) ? std::string(", projected states ") + name_of(cfg.state_blocking) : "";
  return "q8 (blocks of " + std::to_string(cfg.state_block) + blocking + "; tensors under " +
         std::to_string(kQuant8MinElements) + " elements: " + plain + ")";
}

AdamArgs adam_args(const OptimizerConfig& cfg, const double* clip, double lr, double weight_decay,
                   int64_t step) {
  return {.grad_scale = 1, .clip = clip, .lr = lr, .beta1 = cfg.beta1, .beta2 = cfg.beta2,
          .eps = cfg.eps, .weight_decay = weight_decay, .step = step};
}

AdamArgs proximal_args(AdamArgs args, double lambda, double lr, int64_t inner, void* anchor) {
  args.lr /= double(inner + 1);
  args.anchor = anchor;
  args.proximal_coef = 2.0 * lambda / lr;
  args.anchor_reset = inner == 0;
  return args;
}

void Optimizer::accumulate(int, void*, const void*, const void*, int64_t, bool) {
  throw InternalError(std::string(name()) + " has no projected tensors");
}

void Optimizer::check_state(const json* saved, const StateReader& reader) const {
  if (state_key() && !saved) reader.fail(std::string(state_key()) + " is missing");
}

std::string describe_projection(const ProjectionConfig& g, const char* refresh,
                                const std::string& extra) {
  std::string targets;
  for (const ProjectionTarget t : g.targets) {
    if (!targets.empty()) targets += ',';
    targets += name_of(t);
  }
  char head[160];
  std::snprintf(head, sizeof head, "rank %d, %s every %lld steps, scale %.3g", g.rank, refresh,
                (long long)g.update_interval, g.scale);
  return head + extra + ", targets " + targets + " (the rest: dense AdamW)";
}

void OptimizerSet::add(std::unique_ptr<Optimizer> o) {
  for (int t : o->tensors()) {
    GRASS_CHECK(t >= 0 && size_t(t) < owner_.size() && !owner_[size_t(t)],
                "a tensor is claimed by two optimizers, or is not in the model");
    owner_[size_t(t)] = o.get();
  }
  all_.push_back(std::move(o));
}

Optimizer& OptimizerSet::of(int tensor) const {
  Optimizer* o = owner_.at(size_t(tensor));
  GRASS_CHECK(o, "a tensor without an optimizer");
  return *o;
}

double OptimizerSet::flops_saved_per_token() const {
  double saved = 0;
  for (const auto& o : all_) saved += o->flops_saved_per_token();
  return saved;
}

bool OptimizerSet::wants_refresh_pass() const {
  for (const auto& o : all_)
    if (o->wants_refresh_pass()) return true;
  return false;
}

bool OptimizerSet::needs_exact_activations() const {
  for (const auto& o : all_)
    if (o->needs_exact_activations()) return true;
  return false;
}

}  // namespace grass
