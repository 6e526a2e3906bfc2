// Where attention's q [B,T,NH,HD], k and v [B,T,NKV,HD] (or their gradients) lie: a pointer and a
// row pitch (elements) each. Three buffers of their own widths (separate_qkv), or views into one
// packed row block [B, T, NH·HD + 2·NKV·HD] (packed_qkv): what one GEMM against q_proj, k_proj and
// v_proj stacked as one [NH·HD + 2·NKV·HD, C] matrix gives, and what one weight-gradient GEMM of
// the stacked weights reads.
#pragma once
#include <cstdint>
#include <type_traits>

namespace grass {

template <typename P>  // P: T*, const T*, void* or const void*
struct QkvRows {
  P q, k, v;
  int64_t ldq, ldk, ldv;
};

namespace qkv_detail {
// base advanced by `elements` of `bytes` each, as a P
template <typename P>
P advance(P base, int64_t elements, int bytes) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char, char>;
  using Void = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const void, void>;
  return static_cast<P>(static_cast<Void*>(reinterpret_cast<Byte*>(base) + elements * bytes));
}
}  // namespace qkv_detail

// q, k, v side by side in each row of `base`, elements of `bytes` each
template <typename P>
QkvRows<P> packed_qkv(P base, int NH, int NKV, int HD, int bytes) {
  const int64_t QD = int64_t(NH) * HD, KVD = int64_t(NKV) * HD, ld = QD + 2 * KVD;
  return {base, qkv_detail::advance(base, QD, bytes), qkv_detail::advance(base, QD + KVD, bytes),
          ld, ld, ld};
}

// q, k, v as three buffers of their own widths
template <typename P>
QkvRows<P> separate_qkv(P q, P k, P v, int NH, int NKV, int HD) {
  return {q, k, v, int64_t(NH) * HD, int64_t(NKV) * HD, int64_t(NKV) * HD};
}

// the same rows, read only
template <typename T>
QkvRows<const T*> read_only(QkvRows<T*> rows) {
  return {rows.q, rows.k, rows.v, rows.ldq, rows.ldk, rows.ldv};
}

}  // namespace grass
