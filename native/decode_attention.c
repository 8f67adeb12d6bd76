/* Attention of one decoded query per row over a KV cache: out = softmax(q k^T * scale) v, for every row and query
 * head at once, in float32 whatever the inputs' dtypes (bfloat16 or float32), the output rounded once to its own.
 *
 * Built at first use by native/build.py with this machine's compiler and called through ctypes by
 * model/decode_attention.py, once per layer of a decode step. Why a kernel of our own: a decode step's attention
 * is a few hundred kilobytes of cache read once, and PyTorch's CPU flash kernel spends most of its time around
 * that (its blocks, its scratch, its dispatch): GPT-2 small's 12 heads over 160 cached bfloat16 positions took
 * ~136 us a layer warm and ~235 us after a matmul had emptied the caches, against ~31 and ~98 us here
 * (benchmarks/RESULTS.md). Here one call does a layer: for each (row, head) pair, on its own thread,
 *
 *   s_j = scale * sum_d q_d k_jd            j = 0 .. length - 1, the written prefix (no mask: all of it is seen)
 *   p_j = exp(s_j - max_j s_j)              max subtracted first, so no exp overflows
 *   out_d = (sum_j p_j v_jd) / sum_j p_j
 *
 * Every sum runs in a fixed order, the dot products and the sum of p in LANES partial sums added up at the end
 * (in a row, or in a tree on the AVX512 loops a -march=native build takes where head_dim is a multiple of 16), and
 * each (row, head) pair is one thread's from start to end: the result does not depend on the thread count, so the
 * module path and the flat decode step (model/decode.py), which both call this, agree bit for bit. exp is a
 * degree-6 polynomial after a reduction by ln 2 (relative error ~1e-7 on [-87, 0]; below -87 it gives exp(-87),
 * ~1.6e-38, next to the maximum's 1). A head with a NaN or an infinite score gives NaN everywhere, as the model's
 * finite check then reports.
 *
 * Layout: q (batch, n_head, head_dim) and k, v (batch, n_kv_head, positions, head_dim), each by its strides in
 * elements, head_dim contiguous; query head h reads kv head h / (n_head / n_kv_head) (grouped-query attention).
 * out: (batch, n_head, head_dim) contiguous; scale 1 / sqrt(head_dim). Returns 0, 1 where a thread's scratch could
 * not be allocated, 2 for sizes out of range. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#define ATTNGPT_AVX512 1
#endif

#define LANES 16

static inline float from_bf16(uint16_t bits) {
    uint32_t widened = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &widened, sizeof f);
    return f;
}

static inline uint16_t to_bf16(float f) {  /* round to nearest even; a NaN becomes the quiet NaN 0x7fc0 */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float element(const void *base, long index, int bf16) {
    return bf16 ? from_bf16(((const uint16_t *)base)[index]) : ((const float *)base)[index];
}

/* exp(x) for x <= 0 (a score less the row's maximum): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its polynomial,
 * 2^n made in the exponent bits; x below -87 is taken as -87, so n >= -126 stays a normal float's exponent */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round(x / ln2), by the 1.5 * 2^23 trick */
    float r = x - n * 0.693359375f;  /* ln2 in two parts: the first exact in a few bits, so r keeps its digits */
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_to_n;
    memcpy(&two_to_n, &bits, sizeof two_to_n);
    return p * two_to_n;
}

/* q . k_j for one key row, in LANES partial sums added in order */
static inline float dot(const float *q, const void *key, int bf16, int head_dim) {
    float lanes[LANES] = {0};
    int d = 0;
    if (bf16) {
        const uint16_t *k = key;
        for (; d + LANES <= head_dim; d += LANES)
            for (int i = 0; i < LANES; i++) lanes[i] += q[d + i] * from_bf16(k[d + i]);
        for (int i = 0; d + i < head_dim; i++) lanes[i] += q[d + i] * from_bf16(k[d + i]);
    } else {
        const float *k = key;
        for (; d + LANES <= head_dim; d += LANES)
            for (int i = 0; i < LANES; i++) lanes[i] += q[d + i] * k[d + i];
        for (int i = 0; d + i < head_dim; i++) lanes[i] += q[d + i] * k[d + i];
    }
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++) sum += lanes[i];
    return sum;
}

/* acc = sum_j p_j v_j, every key's row in turn */
static inline void weighted_values(const float *p, const char *values, int bf16, long position_stride, int head_dim,
                                   int length, float *acc) {
    size_t width = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int d = 0; d < head_dim; d++) acc[d] = 0.0f;
    for (int j = 0; j < length; j++) {
        const void *row = values + (size_t)j * position_stride * width;
        if (bf16) {
            const uint16_t *value = row;
            for (int d = 0; d < head_dim; d++) acc[d] += p[j] * from_bf16(value[d]);
        } else {
            const float *value = row;
            for (int d = 0; d < head_dim; d++) acc[d] += p[j] * value[d];
        }
    }
}

#ifdef ATTNGPT_AVX512
/* 16 keys' or values' elements from k (bfloat16 or float32) as float32 */
static inline __m512 load16(const void *k, int bf16) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(k)), 16));
    return _mm512_loadu_ps(k);
}

/* dot() for head_dim a multiple of 16: the same LANES partial sums, added up in a tree (_mm512_reduce_add_ps)
 * rather than in a row */
static inline float dot16(const float *q, const char *key, int bf16, int head_dim) {
    size_t width = bf16 ? sizeof(uint16_t) : sizeof(float);
    __m512 lanes = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; d += LANES)
        lanes = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load16(key + (size_t)d * width, bf16), lanes);
    return _mm512_reduce_add_ps(lanes);
}

/* acc = sum_j p_j v_j for head_dim a multiple of 16, 16 elements at a time over every j (the sums of the portable
 * loop, in the same order: one fused multiply-add a key) */
static inline void weighted_values16(const float *p, const char *values, int bf16, long position_stride,
                                     int head_dim, int length, float *acc) {
    size_t width = bf16 ? sizeof(uint16_t) : sizeof(float), row = (size_t)position_stride * width;
    for (int d = 0; d < head_dim; d += LANES) {
        __m512 sum = _mm512_setzero_ps();
        const char *value = values + (size_t)d * width;
        for (int j = 0; j < length; j++, value += row)
            sum = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), load16(value, bf16), sum);
        _mm512_storeu_ps(acc + d, sum);
    }
}
#endif

/* q . k_j and sum_j p_j v_j on the AVX512 loops where the build has them and head_dim is a multiple of 16 */
static inline float key_dot(const float *q, const char *key, int bf16, int head_dim) {
#ifdef ATTNGPT_AVX512
    if (head_dim % LANES == 0) return dot16(q, key, bf16, head_dim);
#endif
    return dot(q, key, bf16, head_dim);
}

static inline void values_weighted(const float *p, const char *values, int bf16, long position_stride, int head_dim,
                                   int length, float *acc) {
#ifdef ATTNGPT_AVX512
    if (head_dim % LANES == 0) {
        weighted_values16(p, values, bf16, position_stride, head_dim, length, acc);
        return;
    }
#endif
    weighted_values(p, values, bf16, position_stride, head_dim, length, acc);
}

/* one (row, head) pair: scores, weights and the weighted values; scratch holds length + 2 head_dim floats */
static void one_head(const void *q, int q_bf16, const void *k, const void *v, int kv_bf16, long position_stride,
                     int head_dim, int length, float scale, float *scratch, void *out, int out_bf16) {
    float *scores = scratch, *query = scratch + length, *acc = query + head_dim;
    for (int d = 0; d < head_dim; d++) query[d] = element(q, d, q_bf16);
    size_t width = kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    const char *keys = k, *values = v;
    float top = -INFINITY, nonfinite = 0.0f;  /* nonfinite: 0 unless some score is NaN or infinite (s * 0) */
    for (int j = 0; j < length; j++) {
        float s = scale * key_dot(query, keys + (size_t)j * position_stride * width, kv_bf16, head_dim);
        scores[j] = s;
        nonfinite += s * 0.0f;
        top = s > top ? s : top;
    }
    if (nonfinite != 0.0f || !(top > -INFINITY)) {  /* NaN compares unequal to 0 */
        for (int d = 0; d < head_dim; d++) {
            if (out_bf16) ((uint16_t *)out)[d] = to_bf16(NAN);
            else ((float *)out)[d] = NAN;
        }
        return;
    }
    for (int j = 0; j < length; j++) scores[j] = exp_nonpositive(scores[j] - top);
    float lanes[LANES] = {0};
    int j = 0;
    for (; j + LANES <= length; j += LANES)
        for (int i = 0; i < LANES; i++) lanes[i] += scores[j + i];
    for (int i = 0; j + i < length; i++) lanes[i] += scores[j + i];
    float total = 0.0f;
    for (int i = 0; i < LANES; i++) total += lanes[i];
    values_weighted(scores, values, kv_bf16, position_stride, head_dim, length, acc);
    float inverse = 1.0f / total;  /* total >= 1: the maximum's own weight is exp(0) = 1 */
    for (int d = 0; d < head_dim; d++) {
        if (out_bf16) ((uint16_t *)out)[d] = to_bf16(acc[d] * inverse);
        else ((float *)out)[d] = acc[d] * inverse;
    }
}

/* One (row, kv head)'s new key or value, head_dim elements of src (bfloat16 or float32), into its cache slot */
static void write_slot(char *dst, int kv_bf16, const char *src, int src_bf16, int head_dim) {
    if (kv_bf16 == src_bf16) {
        memcpy(dst, src, (size_t)head_dim * (kv_bf16 ? sizeof(uint16_t) : sizeof(float)));
    } else if (kv_bf16) {  /* a float32 model's key into a bfloat16 cache: rounded once */
        for (int d = 0; d < head_dim; d++) ((uint16_t *)dst)[d] = to_bf16(((const float *)src)[d]);
    } else {  /* widened exactly */
        for (int d = 0; d < head_dim; d++) ((float *)dst)[d] = from_bf16(((const uint16_t *)src)[d]);
    }
}

/* The arguments, one int64 each (pointers as addresses), in this order: a caller that decodes many tokens over one
 * cache keeps one array and rewrites only what changes (q, its strides, the length, the output, the new row).
 * K_NEW and V_NEW, where not 0: the step's new keys and values, (batch, n_kv_head, head_dim) by their strides in
 * elements (NEW_HEAD_STRIDE shared, head_dim contiguous), written into slot length - 1 first, converted to the
 * cache's dtype, so that one call does a layer's cache write and its attention. */
enum { ARG_THREADS, ARG_Q, ARG_Q_BATCH_STRIDE, ARG_Q_HEAD_STRIDE, ARG_Q_BF16, ARG_K, ARG_V, ARG_KV_BATCH_STRIDE,
       ARG_KV_HEAD_STRIDE, ARG_KV_POSITION_STRIDE, ARG_KV_BF16, ARG_BATCH, ARG_N_HEAD, ARG_N_KV_HEAD, ARG_HEAD_DIM,
       ARG_LENGTH, ARG_OUT, ARG_OUT_BF16, ARG_K_NEW, ARG_K_NEW_BATCH_STRIDE, ARG_V_NEW, ARG_V_NEW_BATCH_STRIDE,
       ARG_NEW_HEAD_STRIDE, ARG_NEW_BF16, ARG_COUNT };

int attngpt_decode_attention_args(void) { return ARG_COUNT; }

int attngpt_decode_attention(const int64_t *args) {
    int64_t batch = args[ARG_BATCH], n_head = args[ARG_N_HEAD], n_kv_head = args[ARG_N_KV_HEAD];
    int64_t head_dim = args[ARG_HEAD_DIM], length = args[ARG_LENGTH];
    if (batch < 1 || n_head < 1 || n_kv_head < 1 || n_head % n_kv_head != 0 || head_dim < 1 || length < 1
            || length > INT32_MAX || head_dim > INT32_MAX || batch * n_head > INT32_MAX)
        return 2;
    int q_bf16 = args[ARG_Q_BF16] != 0, kv_bf16 = args[ARG_KV_BF16] != 0, out_bf16 = args[ARG_OUT_BF16] != 0;
    const char *q = (const char *)(intptr_t)args[ARG_Q];
    char *k = (char *)(intptr_t)args[ARG_K], *v = (char *)(intptr_t)args[ARG_V];
    char *out = (char *)(intptr_t)args[ARG_OUT];
    const char *k_new = (const char *)(intptr_t)args[ARG_K_NEW], *v_new = (const char *)(intptr_t)args[ARG_V_NEW];
    int new_bf16 = args[ARG_NEW_BF16] != 0;
    size_t new_width = new_bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t q_batch_stride = args[ARG_Q_BATCH_STRIDE], q_head_stride = args[ARG_Q_HEAD_STRIDE];
    int64_t kv_batch_stride = args[ARG_KV_BATCH_STRIDE], kv_head_stride = args[ARG_KV_HEAD_STRIDE];
    long position_stride = (long)args[ARG_KV_POSITION_STRIDE];
    float scale = (float)(1.0 / sqrt((double)head_dim));  /* as the fused kernel's default, 1 / sqrt(head_dim) */
    int64_t group = n_head / n_kv_head, pairs = batch * n_head;
    int threads = args[ARG_THREADS] < 1 ? 1 : args[ARG_THREADS] > pairs ? (int)pairs : (int)args[ARG_THREADS];
    size_t q_width = q_bf16 ? sizeof(uint16_t) : sizeof(float), kv_width = kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    size_t out_width = out_bf16 ? sizeof(uint16_t) : sizeof(float);
    int failed = 0;
    (void)threads;  /* a build without OpenMP runs on one */
#pragma omp parallel num_threads(threads)
    {
        float *scratch = malloc(sizeof(float) * ((size_t)length + 2 * (size_t)head_dim));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        if (k_new != NULL && v_new != NULL) {  /* the new row first; the loop's end waits for every thread */
#pragma omp for schedule(static)
            for (int64_t pair = 0; pair < batch * n_kv_head; pair++) {
                int64_t row = pair / n_kv_head, kv_head = pair % n_kv_head;
                size_t slot = (size_t)(row * kv_batch_stride + kv_head * kv_head_stride
                                       + (length - 1) * position_stride) * kv_width;
                size_t from = (size_t)(kv_head * args[ARG_NEW_HEAD_STRIDE]) * new_width;
                write_slot(k + slot, kv_bf16, k_new + (size_t)(row * args[ARG_K_NEW_BATCH_STRIDE]) * new_width + from,
                           new_bf16, (int)head_dim);
                write_slot(v + slot, kv_bf16, v_new + (size_t)(row * args[ARG_V_NEW_BATCH_STRIDE]) * new_width + from,
                           new_bf16, (int)head_dim);
            }
        }
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; pair++) {
            if (scratch == NULL) continue;
            int64_t row = pair / n_head, head = pair % n_head, kv_head = head / group;
            int64_t kv_offset = row * kv_batch_stride + kv_head * kv_head_stride;
            one_head(q + (size_t)(row * q_batch_stride + head * q_head_stride) * q_width, q_bf16,
                     k + (size_t)kv_offset * kv_width, v + (size_t)kv_offset * kv_width, kv_bf16, position_stride,
                     (int)head_dim, (int)length, scale, scratch, out + (size_t)pair * head_dim * out_width, out_bf16);
        }
        free(scratch);
    }
    return failed;
}
