/* Weight-only int8 matrix-vector product for one activation row: y = W x + b, with W held as int8 codes and one
 * float scale per output row, x carried as two int8 digits (model/quantize.py's module doc has the numbers).
 *
 * Built at first use by native/build.py with this machine's compiler (-O3 -march=native, OpenMP where the
 * compiler has it) and called through ctypes, once per matmul of a decode step. Why a kernel of our own: at one
 * row, torch's CPU int8 kernels read their int8 weights no faster than a bfloat16 matrix-vector product reads twice
 * the bytes (GPT-2 small's 48 block matmuls: FBGEMM ~4.5 ms plus the digits' ops, _weight_int8pack_mm ~8 ms,
 * bfloat16 ~5.7 ms; benchmarks/RESULTS.md), so int8 gained little. Here one call does everything a row needs: its
 * two digits, the integer products of both with every weight row (the weights read once), the scales and the
 * bias, the output in the input's dtype.
 *
 * Numbers, for D = levels / 2 - 1 and B = 2 D (levels = 256: D = 127, B = 254):
 *   s = max(max_k |x_k| / D, FLT_MIN)        the row's digit scale, in float32
 *   u_k = x_k / s, h_k = round(u_k), l_k = round((u_k - h_k) B)     both in [-D, D], rounding half to even
 *   y_n = s * w_n * (sum_k q_nk h_k + sum_k q_nk l_k / B) + b_n     q: int8 codes, w_n: row n's scale
 * The sums are exact in int32 (each code times a weight is at most 255 * 127, so in_features up to
 * MAX_IN_FEATURES = 65536), the same digits
 * and integer sums as the FBGEMM path in model/quantize.py; only the float combination at the end rounds in its
 * own order. A row holding a NaN or an infinity gives NaN everywhere, as a float product would.
 *
 * Weight layout (made by model/int8_matvec.py's pack): rows in blocks of 4, each block's rows interleaved in
 * 64-byte chunks, P[block][k / 64][row in block][64], with rows padded to a multiple of 4 and K to a multiple of
 * 64 by zeros. A block is then one contiguous stream: at one row, the speed of a matrix-vector product is the
 * speed at which the weights arrive, and four rows read side by side from four places streamed at half the rate
 * of this layout here (one core: 9 against 26 GB/s).
 *
 * The digits are stored with an offset, as codes c = digit + levels / 2 in [1, levels - 1], because AVX512-VNNI's
 * vpdpbusd multiplies unsigned by signed bytes: sum_k c_k q_nk = sum_k digit_k q_nk + (levels / 2) sum_k q_nk, and
 * the caller passes sum_k q_nk per row (row_sums) to take the offset's share off. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ATTNGPT_VNNI 1
#endif

#define ROWS_PER_BLOCK 4
#define CHUNK 64

static float bf16_to_float(uint16_t v) {
  uint32_t bits = (uint32_t)v << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint16_t float_to_bf16(float f) { /* round to nearest, ties to even; NaN stays a quiet NaN */
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

static float input_at(const void* x, int x_bf16, int k) {
  return x_bf16 ? bf16_to_float(((const uint16_t*)x)[k]) : ((const float*)x)[k];
}

static void store(void* y, int y_bf16, int n, float v) {
  if (y_bf16) ((uint16_t*)y)[n] = float_to_bf16(v);
  else ((float*)y)[n] = v;
}

/* The integer sums of one block of 4 rows: hsum[r] = sum_k c_h,k q_rk, lsum[r] likewise, over padded_in columns. */
static void block_sums(const int8_t* block, const uint8_t* high, const uint8_t* low, int padded_in,
                       int32_t hsum[ROWS_PER_BLOCK], int32_t lsum[ROWS_PER_BLOCK]) {
#ifdef ATTNGPT_VNNI
  __m512i h0 = _mm512_setzero_si512(), h1 = h0, h2 = h0, h3 = h0, l0 = h0, l1 = h0, l2 = h0, l3 = h0;
  for (int k = 0; k < padded_in; k += CHUNK, block += ROWS_PER_BLOCK * CHUNK) {
    const __m512i ch = _mm512_loadu_si512(high + k), cl = _mm512_loadu_si512(low + k);
    const __m512i w0 = _mm512_loadu_si512(block), w1 = _mm512_loadu_si512(block + CHUNK),
                  w2 = _mm512_loadu_si512(block + 2 * CHUNK), w3 = _mm512_loadu_si512(block + 3 * CHUNK);
    h0 = _mm512_dpbusd_epi32(h0, ch, w0); l0 = _mm512_dpbusd_epi32(l0, cl, w0);
    h1 = _mm512_dpbusd_epi32(h1, ch, w1); l1 = _mm512_dpbusd_epi32(l1, cl, w1);
    h2 = _mm512_dpbusd_epi32(h2, ch, w2); l2 = _mm512_dpbusd_epi32(l2, cl, w2);
    h3 = _mm512_dpbusd_epi32(h3, ch, w3); l3 = _mm512_dpbusd_epi32(l3, cl, w3);
  }
  hsum[0] = _mm512_reduce_add_epi32(h0); hsum[1] = _mm512_reduce_add_epi32(h1);
  hsum[2] = _mm512_reduce_add_epi32(h2); hsum[3] = _mm512_reduce_add_epi32(h3);
  lsum[0] = _mm512_reduce_add_epi32(l0); lsum[1] = _mm512_reduce_add_epi32(l1);
  lsum[2] = _mm512_reduce_add_epi32(l2); lsum[3] = _mm512_reduce_add_epi32(l3);
#else
  for (int r = 0; r < ROWS_PER_BLOCK; r++) hsum[r] = lsum[r] = 0;
  for (int k = 0; k < padded_in; k += CHUNK, block += ROWS_PER_BLOCK * CHUNK)
    for (int r = 0; r < ROWS_PER_BLOCK; r++) {
      int32_t hs = 0, ls = 0;
      for (int j = 0; j < CHUNK; j++) {
        hs += (int32_t)high[k + j] * block[r * CHUNK + j];
        ls += (int32_t)low[k + j] * block[r * CHUNK + j];
      }
      hsum[r] += hs;
      lsum[r] += ls;
    }
#endif
}

/* Whether this build multiplies with AVX512-VNNI (1) or the portable loop (0): for the kernel's description. */
int attngpt_int8_matvec_vnni(void) {
#ifdef ATTNGPT_VNNI
  return 1;
#else
  return 0;
#endif
}

/* y (out_features, float32 or bfloat16) = the product of the packed weight with one row x (in_features, float32 or
 * bfloat16), as in the file's comment. packed: (padded_out / 4) blocks of padded_in * 4 bytes; row_sums, scales
 * (float32) and bias (float32, or NULL) have out_features entries. Returns 0, or -1 where the digits' buffer
 * cannot be allocated (y untouched). */
int attngpt_int8_matvec(const int8_t* packed, const int32_t* row_sums, const float* scales, const float* bias,
                        int out_features, int in_features, int padded_in, int levels, int threads,
                        const void* x, int x_bf16, void* y, int y_bf16) {
  const int top = levels / 2 - 1, offset = levels / 2;
  const float base = (float)(levels - 2);
  float largest = 0.0f;
  int finite = 1;
  for (int k = 0; k < in_features; k++) {
    const float a = fabsf(input_at(x, x_bf16, k));
    if (!(a <= FLT_MAX)) finite = 0; /* NaN or infinity */
    largest = a > largest ? a : largest;
  }
  if (!finite) {
    for (int n = 0; n < out_features; n++) store(y, y_bf16, n, NAN);
    return 0;
  }
  float scale = largest / (float)top;
  if (scale < FLT_MIN) scale = FLT_MIN; /* an all-zero (or subnormal) row: finite 1 / scale, its digits 0 */
  uint8_t* codes = (uint8_t*)malloc(2 * (size_t)padded_in);
  if (codes == NULL) return -1;
  uint8_t *high = codes, *low = codes + padded_in;
  for (int k = 0; k < in_features; k++) {
    const float u = input_at(x, x_bf16, k) / scale; /* a division, as torch's digits divide: the same u */
    const float h = nearbyintf(u);
    const float l = nearbyintf((u - h) * base);
    high[k] = (uint8_t)((int)h + offset);
    low[k] = (uint8_t)((int)l + offset);
  }
  memset(high + in_features, offset, (size_t)(padded_in - in_features)); /* the padding's digits: 0 */
  memset(low + in_features, offset, (size_t)(padded_in - in_features));
  const int blocks = (out_features + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  const float inverse_base = 1.0f / base;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int b = 0; b < blocks; b++) {
    int32_t hsum[ROWS_PER_BLOCK], lsum[ROWS_PER_BLOCK];
    block_sums(packed + (size_t)b * ROWS_PER_BLOCK * padded_in, high, low, padded_in, hsum, lsum);
    for (int r = 0; r < ROWS_PER_BLOCK; r++) {
      const int n = b * ROWS_PER_BLOCK + r;
      if (n >= out_features) break;
      const int32_t shift = offset * row_sums[n];
      const float product = (float)(hsum[r] - shift) + (float)(lsum[r] - shift) * inverse_base;
      store(y, y_bf16, n, scale * scales[n] * product + (bias ? bias[n] : 0.0f));
    }
  }
  free(codes);
  return 0;
}
