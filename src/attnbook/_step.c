/* One token of a DecoderLM as one C call: attnbook.decoding's native step (CPU, float32).
 *
 * StaticDecoder (decoding.py) holds every weight, state and KV cache at a fixed address, so a whole step (the
 * embedding, each block's layer norms, projections, attention and MLP, the head) can run in one call without
 * Python or torch's dispatch in between: at chapter 7's width that overhead is most of a step done as ~50
 * torch operations. The arithmetic is torch's (nn.LayerNorm, nn.Linear, exact GELU, elu + 1 or relu features,
 * attnbook.flow_attention_step's order of operations, softmax over the cached keys, MoHAttention.route's gates);
 * the results agree with DecoderLM.step to float32 rounding (tests/test_decoding.py).
 *
 * Compiled by attnbook._native when first needed, with the host's C compiler; nothing here touches Python.
 * Every product is written so that the compiler vectorises it: weights are stored (in, out), row-major, and
 * the inner loop runs along the contiguous output.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { KIND_SOFTMAX = 0, KIND_LINEAR = 1, KIND_FLOW = 2, KIND_MOH = 3 };
enum { PHI_ELU1 = 0, PHI_RELU = 1 };

/* Mirrors attnbook._native.Layer (ctypes): the field order and types must match. */
typedef struct {
    int64_t kind, H, D, hidden, phi, competition, allocation;
    /* MoH: shared heads h_s, routed heads picked per token k, routed heads in all E (H = h_s + E) */
    int64_t shared, picked, experts;
    float eps, ln1_eps, ln2_eps, scale; /* scale: softmax's and MoH's, on q . k */
    const float *ln1_w, *ln1_b, *wqkv, *bqkv, *wo, *bo, *ln2_w, *ln2_b, *w1, *b1, *w2, *b2;
    /* MoH's router, (C, E), (C, 2), (C, h_s), each NULL where the layer has none */
    const float *wg, *wg0, *wg1;
    /* linear: s0 = [S | z] (B, H, D, D + 1); flow: s0 = sums (B, 2, H, D), s1 = ratios (B, 2, H, D),
     * s2 = exp_mean (B, H), s3 = kv (B, H, D, D); softmax and MoH: s0 = keys, s1 = values, (B, H, capacity, D) */
    float *s0, *s1, *s2, *s3;
} layer_t;

/* Mirrors attnbook._native.Model. */
typedef struct {
    int64_t B, C, V, L, capacity;
    float lnf_eps, unused;
    const float *embed, *positions, *lnf_w, *lnf_b, *head;
    float *work; /* scratch: see attnbook_work_size */
    const layer_t *layers;
} model_t;

/* exp(x) for x <= 0 (softmax's shifted scores, elu's negative side) as a branch-free polynomial that the
 * compiler vectorises, within 2 ulp of expf over [-87, 0]; below -87 it returns exp(-87) ~ 1.6e-38, which
 * next to the largest score's exp(0) = 1 is nothing. NaN stays NaN. (Cody-Waite reduction, Cephes' minimax
 * polynomial for expf.) */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n: n is in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* y = add + x W + b for R rows at once: x (R, K), W (K, N) row-major, y and add (R, N); add and b may be NULL; y
 * may be add (a residual, in place). Four rows of W are read once for all R rows of x (they stay in the
 * first-level cache), so a batch reads the weights once, as one token does. */
static void affine(const float *restrict x, const float *restrict W, const float *b, const float *add, int64_t R,
                   int64_t K, int64_t N, float *y) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) y[r * N + n] = (add ? add[r * N + n] : 0.0f) + (b ? b[n] : 0.0f);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float *restrict w0 = W + k * N, *restrict w1 = w0 + N, *restrict w2 = w1 + N, *restrict w3 = w2 + N;
        for (int64_t r = 0; r < R; r++) {
            const float *xr = x + r * K;
            const float x0 = xr[k], x1 = xr[k + 1], x2 = xr[k + 2], x3 = xr[k + 3];
            float *restrict yr = y + r * N;
            for (int64_t n = 0; n < N; n++) yr[n] += x0 * w0[n] + x1 * w1[n] + x2 * w2[n] + x3 * w3[n];
        }
    }
    for (; k < K; k++) {
        const float *restrict w = W + k * N;
        for (int64_t r = 0; r < R; r++) {
            const float xk = x[r * K + k];
            float *restrict yr = y + r * N;
            for (int64_t n = 0; n < N; n++) yr[n] += xk * w[n];
        }
    }
}

/* nn.LayerNorm over C numbers: (x - mean) / sqrt(var + eps) * w + b, the biased variance. */
static void layer_norm(const float *restrict x, const float *restrict w, const float *restrict b, float eps,
                       int64_t C, float *restrict y) {
    float mean = 0.0f, var = 0.0f;
    for (int64_t c = 0; c < C; c++) mean += x[c];
    mean /= (float)C;
    for (int64_t c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    const float rstd = 1.0f / sqrtf(var / (float)C + eps);
    for (int64_t c = 0; c < C; c++) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
}

static inline float feature(float x, int64_t phi) {
    if (phi == PHI_RELU) return x > 0.0f ? x : 0.0f;
    return x > 0.0f ? x + 1.0f : exp_nonpositive(x); /* elu(x) + 1 */
}

/* Linear attention, one head: [S | z] += phi(k) [v | 1]^T, out = phi(q)^T S / (phi(q)^T z + eps). */
static void linear_head(const layer_t *l, float *restrict Sz, const float *q, const float *k, const float *v,
                        float *restrict fq, float *restrict r, float *restrict out) {
    const int64_t D = l->D, W = D + 1;
    for (int64_t d = 0; d < D; d++) fq[d] = feature(q[d], l->phi);
    for (int64_t d = 0; d < D; d++) {
        const float fk = feature(k[d], l->phi);
        float *restrict row = Sz + d * W;
        for (int64_t j = 0; j < D; j++) row[j] += fk * v[j];
        row[D] += fk;
    }
    for (int64_t j = 0; j < W; j++) r[j] = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        const float f = fq[d];
        const float *restrict row = Sz + d * W;
        for (int64_t j = 0; j < W; j++) r[j] += f * row[j];
    }
    const float denominator = r[D] + l->eps;
    for (int64_t j = 0; j < D; j++) out[j] = r[j] / denominator;
}

/* Flow-Attention, one head, token number n (this one included), as attnbook.flow_attention_step. */
static void flow_head(const layer_t *l, int64_t b, int64_t h, float n, const float *q, const float *k,
                      const float *v, float *restrict qs, float *restrict ks, float *restrict cv,
                      float *restrict out) {
    const int64_t H = l->H, D = l->D;
    const float eps = l->eps;
    float *restrict query_sum = l->s0 + ((b * 2 + 0) * H + h) * D, *restrict key_sum = l->s0 + ((b * 2 + 1) * H + h) * D;
    float *restrict query_ratio = l->s1 + ((b * 2 + 0) * H + h) * D, *restrict key_ratio = l->s1 + ((b * 2 + 1) * H + h) * D;
    float *exp_mean = l->s2 + b * H + h;
    float *restrict kv = l->s3 + (b * H + h) * D * D;
    for (int64_t d = 0; d < D; d++) {
        qs[d] = sigmoidf(q[d]);
        ks[d] = sigmoidf(k[d]);
        query_sum[d] += qs[d];
        key_sum[d] += ks[d];
    }
    float incoming = 0.0f, outgoing = 0.0f; /* I n and O n */
    for (int64_t d = 0; d < D; d++) {
        incoming += (qs[d] + eps) * (key_sum[d] + eps);
        outgoing += (ks[d] + eps) * (query_sum[d] + eps);
    }
    for (int64_t d = 0; d < D; d++) {
        query_ratio[d] += n * qs[d] / incoming;
        key_ratio[d] += n * ks[d] / outgoing;
    }
    float conserved_in = 0.0f, conserved_out = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        conserved_in += (qs[d] + eps) * (key_ratio[d] + eps);
        conserved_out += (ks[d] + eps) * (query_ratio[d] + eps);
    }
    conserved_in /= n;
    conserved_out /= n;
    float competition = 1.0f;
    if (l->competition) {
        const float expo = expf(fminf(fmaxf(conserved_out, -1.0f), 1.0f));
        *exp_mean += (expo - *exp_mean) / n; /* lerp_(expo, 1 / n): the running mean, this token included */
        competition = expo / *exp_mean;
    }
    for (int64_t j = 0; j < D; j++) cv[j] = v[j] * competition;
    for (int64_t d = 0; d < D; d++) {
        float *restrict row = kv + d * D;
        for (int64_t j = 0; j < D; j++) row[j] += ks[d] * cv[j];
    }
    const float scale = l->allocation ? sigmoidf(conserved_in) / incoming : 1.0f / incoming;
    for (int64_t j = 0; j < D; j++) out[j] = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        const float f = qs[d];
        const float *restrict row = kv + d * D;
        for (int64_t j = 0; j < D; j++) out[j] += f * row[j];
    }
    for (int64_t j = 0; j < D; j++) out[j] *= scale;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* The sums of eight vectors of eight, as one vector: [sum v0, ..., sum v7]. */
static inline __m256 sums8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6, __m256 v7) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* scores[i] = q . keys[i] * scale for i < n, eight keys at a time (D a multiple of 8, at most 64); returns how
 * many it did (a multiple of 8: the caller does the rest). */
static int64_t scores_avx2(const float *q, const float *keys, int64_t n, int64_t D, float scale, float *scores) {
    if (D % 8 != 0 || D > 64) return 0;
    __m256 qv[8];
    const int64_t chunks = D / 8;
    for (int64_t c = 0; c < chunks; c++) qv[c] = _mm256_loadu_ps(q + 8 * c);
    const __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float *k = keys + i * D;
        __m256 r[8];
        for (int64_t row = 0; row < 8; row++) {
            __m256 acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k + row * D));
            for (int64_t c = 1; c < chunks; c++) acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + row * D + 8 * c), acc);
            r[row] = acc;
        }
        _mm256_storeu_ps(scores + i, _mm256_mul_ps(sums8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]), s));
    }
    return i;
}

/* out = sum_i weights[i] values[i] over i < n (D a multiple of 8, at most 64), accumulated in registers, even
 * and odd rows apart (two chains of fused multiply-adds instead of one, so that each waits half as long for
 * the last); returns 0 when D does not suit (the caller's loop does it). */
static int weighted_sum_avx2(const float *weights, const float *values, int64_t n, int64_t D, float *out) {
    if (D % 8 != 0 || D > 64) return 0;
    __m256 even[8], odd[8];
    const int64_t chunks = D / 8;
    for (int64_t c = 0; c < chunks; c++) even[c] = odd[c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        const __m256 w0 = _mm256_set1_ps(weights[i]), w1 = _mm256_set1_ps(weights[i + 1]);
        const float *v = values + i * D;
        for (int64_t c = 0; c < chunks; c++) {
            even[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v + 8 * c), even[c]);
            odd[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v + D + 8 * c), odd[c]);
        }
    }
    if (i < n) {
        const __m256 w = _mm256_set1_ps(weights[i]);
        for (int64_t c = 0; c < chunks; c++) even[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values + i * D + 8 * c), even[c]);
    }
    for (int64_t c = 0; c < chunks; c++) _mm256_storeu_ps(out + 8 * c, _mm256_add_ps(even[c], odd[c]));
    return 1;
}
#else
static int64_t scores_avx2(const float *q, const float *keys, int64_t n, int64_t D, float scale, float *scores) {
    (void)q, (void)keys, (void)n, (void)D, (void)scale, (void)scores;
    return 0;
}
static int weighted_sum_avx2(const float *weights, const float *values, int64_t n, int64_t D, float *out) {
    (void)weights, (void)values, (void)n, (void)D, (void)out;
    return 0;
}
#endif

/* Softmax attention, one head: row t of the cache written, then the query over rows 0 .. t. */
static void softmax_head(const layer_t *l, int64_t capacity, int64_t b, int64_t h, int64_t t, const float *q,
                         const float *k, const float *v, float *restrict scores, float *restrict out) {
    const int64_t D = l->D, n = t + 1;
    float *restrict keys = l->s0 + (b * l->H + h) * capacity * D, *restrict values = l->s1 + (b * l->H + h) * capacity * D;
    memcpy(keys + t * D, k, (size_t)D * sizeof(float));
    memcpy(values + t * D, v, (size_t)D * sizeof(float));
    const float scale = l->scale;
    for (int64_t i = scores_avx2(q, keys, n, D, scale, scores); i < n; i++) {
        const float *restrict key = keys + i * D;
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s += q[d] * key[d];
        scores[i] = s * scale;
    }
    float top = -INFINITY;
    for (int64_t i = 0; i < n; i++) top = scores[i] > top ? scores[i] : top;
    float total = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float e = exp_nonpositive(scores[i] - top);
        scores[i] = e;
        total += e;
    }
    if (!weighted_sum_avx2(scores, values, n, D, out)) {
        for (int64_t j = 0; j < D; j++) out[j] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const float w = scores[i];
            const float *restrict value = values + i * D;
            for (int64_t j = 0; j < D; j++) out[j] += w * value[j];
        }
    }
    const float inverse = 1.0f / total;
    for (int64_t j = 0; j < D; j++) out[j] *= inverse;
}

/* x = softmax(x) * times over n numbers, in place (max subtracted first, as torch does). */
static void softmax_times(float *x, int64_t n, float times) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t i = 0; i < n; i++) top = x[i] > top ? x[i] : top;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - top);
        total += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / total * times;
}

/* MoH's gates of one token, as MoHAttention.route: the shared heads h_s softmax(W_s h) (1 for a single shared
 * head), the routed heads the top k of p = softmax(W_r h) renormalised over the k and scaled by k, both
 * weighted by 2 softmax(W_h h) when there are shared heads. gates: H; scratch: E + 2. */
static void moh_gates(const layer_t *l, const float *h, int64_t C, float *gates, float *scratch) {
    const int64_t s = l->shared, k = l->picked, E = l->experts;
    float *shared = gates, *routed = gates + s;
    if (s > 1) {
        affine(h, l->wg1, NULL, NULL, 1, C, s, shared);
        softmax_times(shared, s, (float)s);
    } else if (s == 1) {
        shared[0] = 1.0f;
    }
    if (k == 0) return;
    float *p = scratch, *weight = scratch + E;
    affine(h, l->wg, NULL, NULL, 1, C, E, p);
    softmax_times(p, E, 1.0f);
    for (int64_t e = 0; e < E; e++) routed[e] = 0.0f;
    float kept = 0.0f;
    for (int64_t j = 0; j < k; j++) { /* the k largest, each the first of its value among those not yet taken */
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (routed[e] == 0.0f && (best < 0 || p[e] > p[best])) best = e;
        routed[best] = 1.0f;
        kept += p[best];
    }
    const float denominator = kept > 1.1920928955078125e-07f ? kept : 1.1920928955078125e-07f; /* clamp(eps) */
    for (int64_t e = 0; e < E; e++) routed[e] = routed[e] != 0.0f ? p[e] / denominator * (float)k : 0.0f;
    if (s > 0) {
        affine(h, l->wg0, NULL, NULL, 1, C, 2, weight);
        softmax_times(weight, 2, 2.0f);
        for (int64_t j = 0; j < s; j++) shared[j] *= weight[0];
        for (int64_t e = 0; e < E; e++) routed[e] *= weight[1];
    }
}

/* Floats of scratch the step needs (attnbook._native allocates them once): x and LN(x), then per layer q, k, v
 * and the heads' outputs, of every row of the batch, and room for the widest of the batch's MLP hidden layer,
 * a head's small vectors (3 D + 1) and one query's scores over the whole cache (capacity). */
int64_t attnbook_work_size(const model_t *m) {
    int64_t widest = 0;
    for (int64_t i = 0; i < m->L; i++) {
        const layer_t *l = &m->layers[i];
        int64_t room = m->B * l->hidden > 3 * l->D + 1 ? m->B * l->hidden : 3 * l->D + 1;
        room = room > m->capacity ? room : m->capacity;
        const int64_t need = 4 * m->B * l->H * l->D + room + m->B * l->H + l->H + 2; /* + MoH's gates */
        widest = need > widest ? need : widest;
    }
    return 2 * m->B * m->C + widest;
}

/* The logits (B, V) after tokens (B,) at position t, the state updated. Returns 0, or b + 1 when token b is
 * not in 0 .. V - 1 (nothing is then read or written: the caller raises). */
int64_t attnbook_step(const model_t *m, const int64_t *tokens, int64_t t, float *logits) {
    const int64_t B = m->B, C = m->C;
    for (int64_t b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= m->V) return b + 1;
    float *x = m->work, *h = x + B * C, *buffer = h + B * C; /* x, h: (B, C) */
    for (int64_t b = 0; b < B; b++) {
        const float *e = m->embed + tokens[b] * C, *p = m->positions + t * C;
        for (int64_t c = 0; c < C; c++) x[b * C + c] = e[c] + p[c];
    }
    for (int64_t i = 0; i < m->L; i++) {
        const layer_t *l = &m->layers[i];
        const int64_t H = l->H, D = l->D, HD = H * D;
        /* qkv (B, 3 H D), att (B, H D), mid: the MLP's hidden (B, hidden) or a head's scratch */
        float *qkv = buffer, *att = qkv + B * 3 * HD, *gates = att + B * HD, *mid = gates + B * H + H + 2;
        for (int64_t b = 0; b < B; b++) layer_norm(x + b * C, l->ln1_w, l->ln1_b, l->ln1_eps, C, h + b * C);
        affine(h, l->wqkv, l->bqkv, NULL, B, C, 3 * HD, qkv);
        if (l->kind == KIND_MOH)
            for (int64_t b = 0; b < B; b++) moh_gates(l, h + b * C, C, gates + b * H, gates + B * H);
        for (int64_t b = 0; b < B; b++) {
            const float *row = qkv + b * 3 * HD;
            for (int64_t head = 0; head < H; head++) {
                const float *q = row + head * D, *k = row + HD + head * D, *v = row + 2 * HD + head * D;
                float *o = att + b * HD + head * D;
                if (l->kind == KIND_LINEAR) {
                    float *Sz = l->s0 + (b * H + head) * D * (D + 1);
                    linear_head(l, Sz, q, k, v, mid, mid + D, o);
                } else if (l->kind == KIND_FLOW) {
                    flow_head(l, b, head, (float)(t + 1), q, k, v, mid, mid + D, mid + 2 * D, o);
                } else {
                    softmax_head(l, m->capacity, b, head, t, q, k, v, mid, o);
                    if (l->kind == KIND_MOH)
                        for (int64_t j = 0; j < D; j++) o[j] *= gates[b * H + head];
                }
            }
        }
        affine(att, l->wo, l->bo, x, B, HD, C, x); /* x + o Wo + bo */
        for (int64_t b = 0; b < B; b++) layer_norm(x + b * C, l->ln2_w, l->ln2_b, l->ln2_eps, C, h + b * C);
        affine(h, l->w1, l->b1, NULL, B, C, l->hidden, mid);
        for (int64_t j = 0; j < B * l->hidden; j++) mid[j] = 0.5f * mid[j] * (1.0f + erff(mid[j] * 0.70710678118654752f));
        affine(mid, l->w2, l->b2, x, B, l->hidden, C, x); /* x + MLP */
    }
    for (int64_t b = 0; b < B; b++) layer_norm(x + b * C, m->lnf_w, m->lnf_b, m->lnf_eps, C, h + b * C);
    affine(h, m->head, NULL, NULL, B, C, m->V, logits);
    return 0;
}
