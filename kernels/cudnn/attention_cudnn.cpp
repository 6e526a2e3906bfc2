// cuDNN's fused flash attention (the run config's `attention: "cudnn"`), beside the engine's own
// kernels (kernels/cuda/attention.cu), which stay the readable ones and the CPU-checked reference.
//
// Built from cuDNN's SDPA graphs through the cuDNN frontend (header-only, in third_party/), with
// libcudnn loaded at run time (dlopen), so the binary links without it and a machine without it
// fails here with one line. One forward and one backward graph per shape (B, T, NH, NKV, HD),
// built at first use and kept: q [B,T,NH,HD], k and v [B,T,NKV,HD] in bf16 read in place through
// strides (the BSHD layout at the row pitches of the packed q, k, v the projections write; dq, dk,
// dv at theirs), GQA by cuDNN's own indexing, the causal mask,
// scale 1/sqrt(HD), fp32 stats [B,NH,T] (natural-log logsumexp per query row, what the forward
// keeps for the backward), and a deterministic backward (the engine's runs repeat bit for bit).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

// The frontend's dynamic loading reads libcudnn's handle from here.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace grass::cuda {

namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

void check(fe::error_t e, const std::string& what) {
  if (!e.is_good()) throw InternalError("cuDNN attention: " + what + ": " + e.get_message());
}

// Row pitches (elements) of q, k, v or of dq, dk, dv; all 0 in a forward graph's grads
struct Pitches {
  int64_t q = 0, k = 0, v = 0;
  auto key() const { return std::tie(q, k, v); }
};
template <typename P>
Pitches pitches(const QkvRows<P>& rows) {
  return {rows.ldq, rows.ldk, rows.ldv};
}

struct Shape {
  int B, T, NH, NKV, HD;
  Pitches in, grads;
  auto key() const { return std::tuple_cat(std::tie(B, T, NH, NKV, HD), in.key(), grads.key()); }
  bool operator<(const Shape& o) const { return key() < o.key(); }
};

// The model's layouts: q, k, v packed; dq, dk, dv packed or three buffers.
Shape model_shape(int B, int T, int NH, int NKV, int HD, bool grads_packed) {
  const Pitches packed = pitches(packed_qkv(static_cast<const bf16*>(nullptr), NH, NKV, HD, 2));
  const Pitches separate =
      pitches(separate_qkv<const bf16*>(nullptr, nullptr, nullptr, NH, NKV, HD));
  return {B, T, NH, NKV, HD, packed, grads_packed ? packed : separate};
}

// [B, H, T, HD] dims with the strides of the engine's [B, T, H, HD] layout, rows at a pitch of ld
// (0: H·HD).
fe::graph::Tensor_attributes bshd(const char* name, int64_t uid, const Shape& s, int H,
                                  int64_t ld = 0) {
  if (ld == 0) ld = int64_t(H) * s.HD;
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({s.B, H, s.T, s.HD})
      .set_stride({int64_t(s.T) * ld, s.HD, ld, 1});
}

// stats [B, NH, T, 1] fp32, contiguous: the engine's lse [B, NH, T]
fe::graph::Tensor_attributes stats_tensor(const Shape& s) {
  return fe::graph::Tensor_attributes()
      .set_name("stats")
      .set_uid(kStats)
      .set_dim({s.B, s.NH, s.T, 1})
      .set_stride({int64_t(s.NH) * s.T, s.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

// sm_version > 0: graphs for that GPU (validated without one); else the current device's. Set
// before the nodes, which copy the graph's context when they are added.
std::shared_ptr<fe::graph::Graph> new_graph(int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// The libraries cuDNN opens at run time on the way to an attention plan: its engines, and NVRTC
// for the runtime-compiled ones (of the CUDA major cuDNN was built for; cuDNN also tries the
// unversioned name).
std::string cudnn_runtime_libraries_missing() {
  std::string missing = libraries_that_do_not_load(
      {"libcudnn_graph.so.9", "libcudnn_heuristic.so.9", "libcudnn_engines_precompiled.so.9",
       "libcudnn_engines_runtime_compiled.so.9"});
  using Version = size_t (*)();
  const auto cudart = reinterpret_cast<Version>(dlsym(fe::cudnn_dlhandle, "cudnnGetCudartVersion"));
  if (cudart) {
    const std::string nvrtc = "libnvrtc.so." + std::to_string(cudart() / 1000);
    if (!libraries_that_do_not_load({"libnvrtc.so"}).empty()) {
      const std::string why = libraries_that_do_not_load({nvrtc});
      if (!why.empty()) missing += (missing.empty() ? "" : "; ") + why;
    }
  }
  return missing;
}

// Validates, lowers and plans a graph for this handle (heuristics mode A, the first plan that
// builds). A failure is the user's to act on (another attention kernel, a library path), so one
// line naming the option and any library cuDNN could not open.
void build(fe::graph::Graph& g, cudnnHandle_t handle, const std::string& what) {
  const auto step = [&](fe::error_t e, const char* stage) {
    if (e.is_good()) return;
    const std::string missing = cudnn_runtime_libraries_missing();
    throw UserError("attention: \"cudnn\": cuDNN could not build the " + what + " graph (" +
                    stage + ": " + e.get_message() + ")" +
                    (missing.empty() ? std::string()
                                     : "; libraries it loads at run time do not load: " + missing +
                                           " (put their directories on LD_LIBRARY_PATH)") +
                    "; or use \"grass\"");
  };
  step(g.validate(), "validate");
  step(g.build_operation_graph(handle), "build_operation_graph");
  step(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  step(g.check_support(handle), "check_support");
  step(g.build_plans(handle), "build_plans");
}

// The forward graph of one shape, not yet built: the tensors of the contract (kernels/cuda/
// cuda_ops.h), the causal mask, scale 1/sqrt(HD), fp32 stats kept for the backward.
std::shared_ptr<fe::graph::Graph> forward_graph_of(const Shape& s, int sm_version = 0) {
  auto g = new_graph(sm_version);
  auto q = g->tensor(bshd("q", kQ, s, s.NH, s.in.q));
  auto k = g->tensor(bshd("k", kK, s, s.NKV, s.in.k));
  auto v = g->tensor(bshd("v", kV, s, s.NKV, s.in.v));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(float(1.0 / std::sqrt(double(s.HD))));
  auto [o, stats] = g->sdpa(q, k, v, options);
  const fe::graph::Tensor_attributes o_attr = bshd("o", kO, s, s.NH);
  o->set_output(true).set_uid(kO).set_dim(o_attr.get_dim()).set_stride(o_attr.get_stride());
  const fe::graph::Tensor_attributes st = stats_tensor(s);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(st.get_dim())
      .set_stride(st.get_stride());
  return g;
}

// The backward graph of one shape, not yet built: deterministic (runs repeat bit for bit).
std::shared_ptr<fe::graph::Graph> backward_graph_of(const Shape& s, int sm_version = 0) {
  auto g = new_graph(sm_version);
  auto q = g->tensor(bshd("q", kQ, s, s.NH, s.in.q));
  auto k = g->tensor(bshd("k", kK, s, s.NKV, s.in.k));
  auto v = g->tensor(bshd("v", kV, s, s.NKV, s.in.v));
  auto o = g->tensor(bshd("o", kO, s, s.NH));
  auto dout = g->tensor(bshd("dout", kDO, s, s.NH));
  auto stats = g->tensor(stats_tensor(s));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(float(1.0 / std::sqrt(double(s.HD))))
                     .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  for (auto [t, uid, heads, ld] :
       {std::tuple{dq, kDQ, s.NH, s.grads.q}, std::tuple{dk, kDK, s.NKV, s.grads.k},
        std::tuple{dv, kDV, s.NKV, s.grads.v}}) {
    const fe::graph::Tensor_attributes attr = bshd("grad", uid, s, heads, ld);
    t->set_output(true).set_uid(uid).set_dim(attr.get_dim()).set_stride(attr.get_stride());
  }
  return g;
}

// Opens libcudnn.so.9 for the frontend once; a UserError naming it where it does not load.
void load_cudnn() {
  if (fe::cudnn_dlhandle) return;
  // The frontend opens a CUDA runtime of its own choosing (libcudart.so.12 or .13, the first it
  // finds); it must be the one the engine runs on, whose streams it is given. A user's setting
  // wins.
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
  fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  if (!fe::cudnn_dlhandle)
    throw UserError(std::string("attention: \"cudnn\" needs cuDNN 9 (libcudnn.so.9), which "
                                "does not load: ") +
                    dlerror() + "; put its directory on LD_LIBRARY_PATH or use \"grass\"");
}

class FrontendAttention final : public CudnnAttention {
 public:
  explicit FrontendAttention(cudaStream_t stream) {
    load_cudnn();
    if (const cudnnStatus_t status = fe::detail::create_handle(&handle_);
        status != CUDNN_STATUS_SUCCESS)
      throw UserError(std::string("attention: \"cudnn\": cudnnCreate failed (") +
                      fe::detail::get_error_string(status) + "); use \"grass\"");
    if (fe::detail::set_stream(handle_, stream) != CUDNN_STATUS_SUCCESS)
      throw InternalError("cuDNN attention: cudnnSetStream failed");
  }
  ~FrontendAttention() override { fe::detail::destroy_handle(handle_); }

  int64_t version() const override {
    // through the library loaded (the frontend's header declares it, but nothing links libcudnn)
    using GetVersion = size_t (*)();
    const auto get = reinterpret_cast<GetVersion>(dlsym(fe::cudnn_dlhandle, "cudnnGetVersion"));
    if (!get) throw InternalError("cuDNN attention: libcudnn.so.9 has no cudnnGetVersion");
    return int64_t(get());
  }

  int64_t workspace_bytes(int B, int T, int NH, int NKV, int HD, bool grads_packed) override {
    const Shape s = model_shape(B, T, NH, NKV, HD, grads_packed);
    int64_t fwd = 0, bwd = 0;
    check(forward_graph(s).get_workspace_size(fwd), "forward workspace size");
    check(backward_graph(s).get_workspace_size(bwd), "backward workspace size");
    return std::max(fwd, bwd);
  }

  void forward(bf16* out, float* stats, QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV,
               int HD, void* workspace, int64_t workspace_bytes) override {
    const Shape s{B, T, NH, NKV, HD, pitches(qkv), {}};
    fe::graph::Graph& g = forward_graph(s);
    check_workspace(g, workspace_bytes, "forward");
    std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<bf16*>(qkv.q)},
                                               {kK, const_cast<bf16*>(qkv.k)},
                                               {kV, const_cast<bf16*>(qkv.v)},
                                               {kO, out},
                                               {kStats, stats}};
    check(g.execute(handle_, pack, workspace), "forward execute");
  }

  void backward(QkvRows<bf16*> d, const bf16* dout, const bf16* out, const float* stats,
                QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV, int HD, void* workspace,
                int64_t workspace_bytes) override {
    const Shape s{B, T, NH, NKV, HD, pitches(qkv), pitches(d)};
    fe::graph::Graph& g = backward_graph(s);
    check_workspace(g, workspace_bytes, "backward");
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<bf16*>(qkv.q)},  {kK, const_cast<bf16*>(qkv.k)},
        {kV, const_cast<bf16*>(qkv.v)},  {kO, const_cast<bf16*>(out)},
        {kDO, const_cast<bf16*>(dout)},  {kStats, const_cast<float*>(stats)},
        {kDQ, d.q},                      {kDK, d.k},
        {kDV, d.v}};
    check(g.execute(handle_, pack, workspace), "backward execute");
  }

 private:
  static void check_workspace(const fe::graph::Graph& g, int64_t have, const char* what) {
    int64_t need = 0;
    check(g.get_workspace_size(need), std::string(what) + " workspace size");
    if (need > have)
      throw InternalError(std::string("cuDNN attention: the ") + what + " graph needs " +
                          std::to_string(need) + " bytes of workspace, the plan gave it " +
                          std::to_string(have) + " (kernels/backend_sizes.cpp)");
  }

  fe::graph::Graph& forward_graph(Shape s) {
    s.grads = {};  // the forward's graph does not depend on them
    auto& slot = forward_[s];
    if (!slot) {
      slot = forward_graph_of(s);
      build(*slot, handle_, "forward");
    }
    return *slot;
  }

  fe::graph::Graph& backward_graph(const Shape& s) {
    auto& slot = backward_[s];
    if (!slot) {
      slot = backward_graph_of(s);
      build(*slot, handle_, "backward");
    }
    return *slot;
  }

  cudnnHandle_t handle_ = nullptr;
  std::map<Shape, std::shared_ptr<fe::graph::Graph>> forward_, backward_;
};

}  // namespace

std::string validate_cudnn_attention(int B, int T, int NH, int NKV, int HD, int sm_version) {
  load_cudnn();
  const Shape packed = model_shape(B, T, NH, NKV, HD, true);
  const Shape separate = model_shape(B, T, NH, NKV, HD, false);
  std::string problems;
  for (auto [what, graph] :
       {std::pair{"forward", forward_graph_of(packed, sm_version)},
        std::pair{"backward", backward_graph_of(packed, sm_version)},
        std::pair{"backward (three gradient buffers)", backward_graph_of(separate, sm_version)}}) {
    fe::error_t e = graph->validate();
    if (!e.is_good())
      problems += (problems.empty() ? "" : "; ") + std::string(what) + ": " + e.get_message();
  }
  return problems;
}

std::string libraries_that_do_not_load(const std::vector<std::string>& libraries) {
  std::string missing;
  for (const std::string& name : libraries) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      dlclose(handle);
      continue;
    }
    const char* why = dlerror();
    missing += (missing.empty() ? "" : "; ") + std::string(why ? why : name + ": does not load");
  }
  return missing;
}

std::unique_ptr<CudnnAttention> make_cudnn_attention(cudaStream_t stream) {
  return std::make_unique<FrontendAttention>(stream);
}

}  // namespace grass::cuda
