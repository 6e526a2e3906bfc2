// Causal self-attention with grouped-query heads, one (batch, head) at a time through BLAS.
// Heads are strided views into q[B,T,NH,HD] and k,v[B,T,NKV,HD] at their row pitches (three
// buffers or one packed q, k, v): no transposes, no K/V copies.
// Causal work only: queries go in blocks of kQueryBlock rows, and block [r0, r1) multiplies
// against keys [0, r1) alone, which skips ~3/8 of the score FLOPs at T = 256. Inside a block the
// few scores above the diagonal are computed and then masked.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

namespace {
constexpr int kQueryBlock = 64;
}

template <typename T>
void attention_forward(T* out, T* probs, QkvRows<const T*> qkv, int B, int T_, int NH, int NKV,
                       int HD) {
  const int group = NH / NKV;  // query heads per kv head
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int ldq = int(qkv.ldq), ldk = int(qkv.ldk), ldv = int(qkv.ldv), ldo = NH * HD;
#pragma omp parallel for collapse(2) schedule(dynamic) \
    if (int64_t(B) * NH * T_ * T_ * HD >= kParallelWork)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int g = h / group;
      const int64_t row0 = int64_t(b) * T_;  // the batch's first row
      const T* qh = qkv.q + row0 * ldq + int64_t(h) * HD;  // [T,HD], row stride ldq
      const T* kg = qkv.k + row0 * ldk + int64_t(g) * HD;  // [T,HD], row stride ldk
      const T* vg = qkv.v + row0 * ldv + int64_t(g) * HD;
      T* p = probs + (size_t(b) * NH + h) * T_ * T_;  // [T,T]
      T* oh = out + row0 * ldo + int64_t(h) * HD;
      for (int r0 = 0; r0 < T_; r0 += kQueryBlock) {
        const int r1 = std::min(T_, r0 + kQueryBlock);  // queries [r0, r1) see keys [0, r1)
        T* pb = p + size_t(r0) * T_;
        // p[r0:r1, 0:r1] = scale · q[r0:r1] k[0:r1]ᵀ
        cpu::gemm(false, true, r1 - r0, r1, HD, scale, qh + r0 * ldq, ldq, kg, ldk, T(0), pb, T_);
        for (int t = r0; t < r1; t++) {  // causal softmax of row t over keys 0..t
          T* row = p + size_t(t) * T_;
          T mx = -std::numeric_limits<T>::infinity();
          for (int s = 0; s <= t; s++) mx = row[s] > mx ? row[s] : mx;
          T sum = 0;
          for (int s = 0; s <= t; s++) sum += (row[s] = std::exp(row[s] - mx));
          const T inv = T(1) / sum;
          for (int s = 0; s <= t; s++) row[s] *= inv;
          for (int s = t + 1; s < T_; s++) row[s] = 0;
        }
        // out[r0:r1] = p[r0:r1, 0:r1] · v[0:r1]
        cpu::gemm(false, false, r1 - r0, HD, r1, T(1), pb, T_, vg, ldv, T(0), oh + r0 * ldo, ldo);
      }
    }
}

template <typename T>
void attention_backward(QkvRows<T*> d, T* scratch, const T* dout, QkvRows<const T*> qkv,
                        const T* probs, int B, int T_, int NH, int NKV, int HD) {
  const int group = NH / NKV;
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int ldq = int(qkv.ldq), ldk = int(qkv.ldk), ldv = int(qkv.ldv), ldo = NH * HD;
  const int lddq = int(d.ldq), lddk = int(d.ldk), lddv = int(d.ldv);
  // One task per (batch, kv head): the query heads of a group all add into the same dk, dv.
#pragma omp parallel for collapse(2) schedule(dynamic) \
    if (int64_t(B) * NH * T_ * T_ * HD >= kParallelWork)
  for (int b = 0; b < B; b++)
    for (int g = 0; g < NKV; g++) {
      const int64_t row0 = int64_t(b) * T_;  // the batch's first row
      const T* kg = qkv.k + row0 * ldk + int64_t(g) * HD;
      const T* vg = qkv.v + row0 * ldv + int64_t(g) * HD;
      T* dkg = d.k + row0 * lddk + int64_t(g) * HD;
      T* dvg = d.v + row0 * lddv + int64_t(g) * HD;
      for (int t = 0; t < T_; t++) {
        std::memset(dkg + t * lddk, 0, HD * sizeof(T));
        std::memset(dvg + t * lddv, 0, HD * sizeof(T));
      }
      for (int h = g * group; h < (g + 1) * group; h++) {
        const T* qh = qkv.q + row0 * ldq + int64_t(h) * HD;
        const T* doh = dout + row0 * ldo + int64_t(h) * HD;
        const T* p = probs + (size_t(b) * NH + h) * T_ * T_;
        T* dp = scratch + (size_t(b) * NH + h) * T_ * T_;
        T* dqh = d.q + row0 * lddq + int64_t(h) * HD;
        for (int r0 = 0; r0 < T_; r0 += kQueryBlock) {
          const int r1 = std::min(T_, r0 + kQueryBlock);
          const T* pb = p + size_t(r0) * T_;
          T* dpb = dp + size_t(r0) * T_;
          const T* dob = doh + r0 * ldo;
          // dv[0:r1] += pᵀ · dout ;  dp = dout · v[0:r1]ᵀ
          cpu::gemm(true, false, r1, HD, r1 - r0, T(1), pb, T_, dob, ldo, T(1), dvg, lddv);
          cpu::gemm(false, true, r1 - r0, r1, HD, T(1), dob, ldo, vg, ldv, T(0), dpb, T_);
          // softmax backward, row by row: ds = p ⊙ (dp - Σ p·dp), then the 1/sqrt(HD) of the scores
          for (int t = r0; t < r1; t++) {
            const T* prow = p + size_t(t) * T_;
            T* row = dp + size_t(t) * T_;
            T dot = 0;
            for (int s = 0; s <= t; s++) dot += prow[s] * row[s];
            for (int s = 0; s <= t; s++) row[s] = prow[s] * (row[s] - dot) * scale;
            for (int s = t + 1; s < r1; s++) row[s] = 0;
          }
          // dq[r0:r1] = ds · k[0:r1] ;  dk[0:r1] += dsᵀ · q[r0:r1]
          cpu::gemm(false, false, r1 - r0, HD, r1, T(1), dpb, T_, kg, ldk, T(0), dqh + r0 * lddq,
                    lddq);
          cpu::gemm(true, false, r1, HD, r1 - r0, T(1), dpb, T_, qh + r0 * ldq, ldq, T(1), dkg,
                    lddk);
        }
      }
    }
}

#define INSTANTIATE(T)                                                                        \
  template void attention_forward<T>(T*, T*, QkvRows<const T*>, int, int, int, int, int);    \
  template void attention_backward<T>(QkvRows<T*>, T*, const T*, QkvRows<const T*>, const T*, \
                                      int, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
