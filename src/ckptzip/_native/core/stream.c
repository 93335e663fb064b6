/* stream.c - framing of the entropy stage: per-segment mode choice, header, validation.
 *
 * Stream = header, then the segments' bodies in order (docs/STREAMS.md):
 *   u8 format | varint n | varint segments | per segment: u8 mode, then
 *     RAW: nothing (body = the n/segments bytes)   CONST: u8 value (no body)
 *     HUFF, RANS, RANS32: varint body length
 * HUFF/RANS body = table | varint size of streams 0..2 | streams 0..3 (stream 3 takes the rest).
 * RANS32 body = table | 32 u32 states | words.  RANS is written for small segments only
 * (CKZ_RANS_SMALL_LIMIT).  ckz_put_segment/ckz_get_segment give the context coder (format 2) the
 * same segments, self-delimiting.
 * The decoder checks every field against the bytes actually present before using it.
 */
#include "stream.h"

#include <math.h>
#include <stdlib.h>

#include "hist.h"
#include "huff.h"
#include "memory.h"
#include "rans.h"

_Static_assert(CKZ_MAX_DECODED <= UINT64_MAX / CKZ_CODED_DEN, "size * CODED_DEN must not overflow");

/* rANS is tried only when the Huffman payload exceeds the order-0 entropy by more than
 * RANS_TRY_PCT percent, and kept only when its body is RANS_KEEP_PCT percent smaller than the
 * Huffman body: it decodes slower (RANS32 ~1 Gsym/s against ~2 for Huffman), so it must buy real
 * ratio.  At 1 %/1 % the exponent planes of bf16 and fp32 weights (Huffman ~1.5 % above the
 * entropy) go rANS: +0.2-0.35 % ratio overall, which puts ckptzip ahead of zipnn's Huffman, while
 * decode stays above 1.2x zipnn's (docs/BENCHMARKS.md, same run).  At 3 %/2 % only low-entropy
 * planes such as Adam exp_avg_sq exponents took it, and bf16 weights tied zipnn. */
#define RANS_TRY_PCT 1
#define RANS_KEEP_PCT 1

#define HEADER_FIXED (1 + 2 * CKZ_MAX_VARINT)     /* format, n, segments */
#define HEADER_PER_SEGMENT (1 + CKZ_MAX_VARINT)   /* mode, then a value byte or a body length */

/* ---- varints (LEB128, minimal form, < 2^63) -------------------------------------------------- */

size_t ckz_put_varint(uint8_t *out, uint64_t v) {
    size_t i = 0;
    for (; v >= 0x80; v >>= 7) out[i++] = (uint8_t)(v | 0x80);
    out[i++] = (uint8_t)v;
    return i;
}

size_t ckz_varint_size(uint64_t v) {
    size_t i = 1;
    for (; v >= 0x80; v >>= 7) i++;
    return i;
}

int ckz_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v, const char *what,
                   ckz_err *err) {
    uint64_t x = 0;
    for (unsigned i = 0; i < CKZ_MAX_VARINT; i++) {
        if (*p == end) return ckz_fail(err, "stream truncated inside %s", what);
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (i && !b) return ckz_fail(err, "%s is not a minimal varint", what);
            *v = x;
            return 0;
        }
    }
    return ckz_fail(err, "%s is longer than %d varint bytes", what, CKZ_MAX_VARINT);
}

/* ---- encoder --------------------------------------------------------------------------------- */

typedef struct {
    uint8_t mode, value;
    uint8_t len[256];                /* HUFF: code lengths */
    uint16_t freq[256];              /* RANS: normalized frequencies */
    size_t size[CKZ_HUF_STREAMS];    /* HUFF, RANS: bytes of each stream */
    const uint8_t *start[CKZ_HUF_STREAMS]; /* RANS, RANS32: the streams, inside scratch */
    size_t body;                     /* bytes this segment contributes after the header */
} seg_plan;

size_t ckz_encode_bound(size_t n, unsigned segments) {
    return HEADER_FIXED + (size_t)segments * HEADER_PER_SEGMENT + n;
}

static size_t streams_body(size_t table, const size_t size[CKZ_HUF_STREAMS]) {
    size_t body = table;
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++)
        body += size[k] + (k + 1 < CKZ_HUF_STREAMS ? ckz_varint_size(size[k]) : 0);
    return body;
}

/* Replaces a HUFF plan by rANS when that pays (see RANS_TRY_PCT): RANS32, or for a segment of
 * fewer than CKZ_RANS_SMALL_LIMIT symbols the four-stream RANS layout.  The choice uses the exact
 * code length of the normalized frequencies (sum of count * log2(SCALE / freq)) plus the final
 * states, so a rejected trial costs no coding; the real body differs from the estimate by the
 * states' fractional bits only (and a RANS body's stream sizes, checked after coding).  On
 * allocation failure the segment simply stays HUFF. */
static void try_rans(const uint8_t *s, size_t m, const uint64_t total[256], seg_plan *p,
                     uint8_t *scratch) {
    double entropy_bits = 0, huff_bits = 0;
    for (unsigned v = 0; v < 256; v++) {
        if (!total[v]) continue;
        entropy_bits += (double)total[v] * log2((double)m / (double)total[v]);
        huff_bits += (double)total[v] * p->len[v];
    }
    if (huff_bits * 100 <= entropy_bits * (100 + RANS_TRY_PCT)) return;
    uint16_t freq[256];
    ckz_rans_normalize(total, m, freq);
    double rans_bits = 0;
    for (unsigned v = 0; v < 256; v++)
        if (total[v]) rans_bits += (double)total[v] * log2((double)CKZ_RANS_PROB_SCALE / freq[v]);
    double coded = (double)ckz_rans_table_size(freq) + rans_bits / 8;
    /* RANS: four 4-byte states and three stream sizes (under 2^14: at most 2 varint bytes each) */
    int small = m < CKZ_RANS_SMALL_LIMIT;
    double estimate = coded + (small ? 4 * CKZ_HUF_STREAMS + 6 : CKZ_RANS32_STATE_BYTES);
    if (estimate * 100 >= (double)p->body * (100 - RANS_KEEP_PCT)) return;
    if (!scratch) return; /* no memory for it: Huffman stays */
    size_t table = ckz_rans_table_size(freq);
    if (small) {
        const uint8_t *start[CKZ_HUF_STREAMS];
        size_t size[CKZ_HUF_STREAMS];
        ckz_rans_encode(s, m, freq, scratch, start, size);
        size_t body = streams_body(table, size);
        if (body >= p->body) return;
        p->mode = CKZ_MODE_RANS;
        p->body = body;
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
            p->start[k] = start[k];
            p->size[k] = size[k];
        }
    } else {
        const uint8_t *start;
        size_t size;
        ckz_rans32_encode(s, m, freq, scratch, &start, &size);
        p->mode = CKZ_MODE_RANS32;
        p->body = table + size;
        p->start[0] = start;
        p->size[0] = size;
    }
    memcpy(p->freq, freq, sizeof freq);
}

/* rans_scratch: ckz_rans32_scratch_size(m) bytes for a RANS32 body, or NULL. */
static void plan_segment(const uint8_t *s, size_t m, seg_plan *p, uint8_t *rans_scratch) {
    p->mode = CKZ_MODE_RAW;
    p->body = m;
    if (!m || ckz_looks_like_noise(s, m)) return;
    uint32_t counts[CKZ_HUF_STREAMS][256];
    ckz_hist_count(s, m, counts);
    uint64_t total[256];
    unsigned distinct = 0;
    double sumsq = 0;
    for (unsigned v = 0; v < 256; v++) {
        total[v] = (uint64_t)counts[0][v] + counts[1][v] + counts[2][v] + counts[3][v];
        if (total[v]) { distinct++; p->value = (uint8_t)v; }
        sumsq += (double)total[v] * (double)total[v];
    }
    if (distinct == 1) {
        p->mode = CKZ_MODE_CONST;
        p->body = 0;
        return;
    }
    /* Shortcut for noise planes: the collision entropy -log2(sum p^2) is a lower bound on the
     * Shannon entropy, hence on any prefix code's length.  If even that misses the limit (with a
     * margin far above rounding error), the exact test below would choose RAW too. */
    double limit = (double)m * CKZ_CODED_NUM / CKZ_CODED_DEN;
    if ((double)m * log2((double)m * (double)m / sumsq) / 8 > limit * (1 + 1e-9) + 1) return;

    ckz_huf_build_lengths(total, p->len);
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++)
        p->size[k] = ckz_huf_stream_bytes(counts[k], p->len);
    size_t body = streams_body(ckz_huf_table_size(p->len), p->size);
    if ((uint64_t)body * CKZ_CODED_DEN < (uint64_t)m * CKZ_CODED_NUM) {
        p->mode = CKZ_MODE_HUFF;
        p->body = body;
        try_rans(s, m, total, p, rans_scratch);
    }
}

/* Writes the body of a planned segment (nothing for CONST); returns its
 * length, p->body. */
static size_t write_body(const uint8_t *s, size_t m, const seg_plan *p, uint8_t *out) {
    uint8_t *o = out;
    if (p->mode == CKZ_MODE_RAW) {
        memcpy(o, s, m);
        o += m;
    } else if (p->mode == CKZ_MODE_HUFF) {
        o += ckz_huf_write_table(p->len, o);
        for (unsigned k = 0; k + 1 < CKZ_HUF_STREAMS; k++) o += ckz_put_varint(o, p->size[k]);
        ckz_huf_encode(s, m, p->len, p->size, o);
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) o += p->size[k];
    } else if (p->mode == CKZ_MODE_RANS) { /* the streams lie back to back from start[0] */
        o += ckz_rans_write_table(p->freq, o);
        for (unsigned k = 0; k + 1 < CKZ_HUF_STREAMS; k++) o += ckz_put_varint(o, p->size[k]);
        size_t streams = 0;
        for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) streams += p->size[k];
        memcpy(o, p->start[0], streams);
        o += streams;
    } else if (p->mode == CKZ_MODE_RANS32) {
        o += ckz_rans_write_table(p->freq, o);
        memcpy(o, p->start[0], p->size[0]);
        o += p->size[0];
    }
    return (size_t)(o - out);
}

size_t ckz_encode(const uint8_t *src, size_t n, unsigned segments, uint8_t *out) {
    seg_plan plan[CKZ_MAX_SEGMENTS];
    size_t m = n / segments, rans_size = ckz_rans32_scratch_size(m);
    uint8_t *scratch = ckz_scratch_get(CKZ_SCRATCH_STREAMS, segments * rans_size);
    for (unsigned j = 0; j < segments; j++)
        plan_segment(src + j * m, m, &plan[j], scratch ? scratch + j * rans_size : NULL);

    if (!out) { /* size only: the header's and the planned bodies' lengths */
        size_t size = 1 + ckz_varint_size(n) + ckz_varint_size(segments);
        for (unsigned j = 0; j < segments; j++) {
            size += 1 + (plan[j].mode == CKZ_MODE_CONST) + plan[j].body;
            if (plan[j].mode >= CKZ_MODE_HUFF) size += ckz_varint_size(plan[j].body);
        }
        ckz_scratch_put(CKZ_SCRATCH_STREAMS, scratch);
        return size;
    }
    uint8_t *o = out;
    *o++ = CKZ_STREAM_FORMAT;
    o += ckz_put_varint(o, n);
    o += ckz_put_varint(o, segments);
    for (unsigned j = 0; j < segments; j++) {
        *o++ = plan[j].mode;
        if (plan[j].mode == CKZ_MODE_CONST) *o++ = plan[j].value;
        if (plan[j].mode >= CKZ_MODE_HUFF) o += ckz_put_varint(o, plan[j].body);
    }
    for (unsigned j = 0; j < segments; j++) o += write_body(src + j * m, m, &plan[j], o);
    ckz_scratch_put(CKZ_SCRATCH_STREAMS, scratch);
    return (size_t)(o - out);
}

size_t ckz_put_segment(const uint8_t *s, size_t m, uint8_t *out) {
    seg_plan p;
    uint8_t *scratch = ckz_scratch_get(CKZ_SCRATCH_STREAMS, ckz_rans32_scratch_size(m));
    plan_segment(s, m, &p, scratch);
    uint8_t *o = out;
    *o++ = p.mode;
    if (p.mode == CKZ_MODE_CONST) *o++ = p.value;
    if (p.mode >= CKZ_MODE_HUFF) o += ckz_put_varint(o, p.body);
    o += write_body(s, m, &p, o);
    ckz_scratch_put(CKZ_SCRATCH_STREAMS, scratch);
    return (size_t)(o - out);
}

int ckz_encode_planes(const uint8_t *src, size_t n, unsigned elem_size, unsigned rotate,
                      uint8_t *out, size_t *out_len, ckz_err *err) {
    uint8_t *planes = ckz_scratch_get(CKZ_SCRATCH_PLANES, n);
    if (!planes) return ckz_fail(err, "out of memory for %zu bytes of planes", n);
    ckz_split_planes(src, planes, n / elem_size, elem_size, rotate);
    *out_len = ckz_encode(planes, n, elem_size, out);
    ckz_scratch_put(CKZ_SCRATCH_PLANES, planes);
    return 0;
}

/* ---- decoder --------------------------------------------------------------------------------- */

typedef struct {
    uint64_t n;
    unsigned segments;
    size_t seg_len;
    uint8_t mode[CKZ_MAX_SEGMENTS], value[CKZ_MAX_SEGMENTS];
    const uint8_t *body[CKZ_MAX_SEGMENTS];
    size_t body_len[CKZ_MAX_SEGMENTS];
} header;

/* A coded segment's body length (a varint), checked against the bytes left in the stream. */
static int get_body_length(const uint8_t **p, const uint8_t *end, unsigned seg, size_t *len,
                           ckz_err *err) {
    uint64_t v = 0;
    if (ckz_get_varint(p, end, &v, "a segment's body length", err)) return -1;
    if (v > (uint64_t)(end - *p))
        return ckz_fail(err, "segment %u body length %llu exceeds the %zu bytes left", seg,
                        (unsigned long long)v, (size_t)(end - *p));
    *len = (size_t)v;
    return 0;
}

static int parse_header(const uint8_t *src, size_t len, header *h, ckz_err *err) {
    const uint8_t *p = src, *end = src + len;
    if (!len) return ckz_fail(err, "stream is empty");
    if (*p != CKZ_STREAM_FORMAT)
        /* reader.NEWER_STREAM: this message's start marks a newer writer's stream */
        return ckz_fail(err, "stream format byte is 0x%02x, expected 0x%02x", *p,
                        CKZ_STREAM_FORMAT);
    p++;
    uint64_t n = 0, segments = 0;
    if (ckz_get_varint(&p, end, &n, "decoded length", err)) return -1;
    if (n > CKZ_MAX_DECODED)
        return ckz_fail(err, "decoded length %llu exceeds %llu", (unsigned long long)n,
                        (unsigned long long)CKZ_MAX_DECODED);
    if (ckz_get_varint(&p, end, &segments, "segment count", err)) return -1;
    if (segments < 1 || segments > CKZ_MAX_SEGMENTS)
        return ckz_fail(err, "segment count %llu is outside 1..%d", (unsigned long long)segments,
                        CKZ_MAX_SEGMENTS);
    if (n % segments)
        return ckz_fail(err, "decoded length %llu is not a multiple of the segment count %llu",
                        (unsigned long long)n, (unsigned long long)segments);
    h->n = n;
    h->segments = (unsigned)segments;
    h->seg_len = (size_t)(n / segments);
    for (unsigned j = 0; j < h->segments; j++) {
        if (p == end) return ckz_fail(err, "stream truncated in the mode of segment %u", j);
        h->mode[j] = *p++;
        h->body_len[j] = 0;
        switch (h->mode[j]) {
        case CKZ_MODE_RAW: h->body_len[j] = h->seg_len; break;
        case CKZ_MODE_CONST:
            if (p == end) return ckz_fail(err, "stream truncated in the value of segment %u", j);
            h->value[j] = *p++;
            break;
        case CKZ_MODE_HUFF:
        case CKZ_MODE_RANS:
        case CKZ_MODE_RANS32:
            if (get_body_length(&p, end, j, &h->body_len[j], err)) return -1;
            break;
        default: return ckz_fail(err, "segment %u has unknown mode %u", j, h->mode[j]);
        }
    }
    /* Bodies follow in order and must use up the stream exactly. */
    for (unsigned j = 0; j < h->segments; j++) {
        size_t left = (size_t)(end - p);
        if (h->body_len[j] > left)
            return ckz_fail(err, "stream truncated: segment %u needs %zu body bytes, %zu left", j,
                            h->body_len[j], left);
        h->body[j] = p;
        p += h->body_len[j];
    }
    if (p != end) return ckz_fail(err, "stream has %zu trailing bytes", (size_t)(end - p));
    return 0;
}

/* HUFF and RANS bodies: table, three stream sizes, four streams. */
static int decode_coded(unsigned mode, const uint8_t *body, size_t len, uint8_t *out, size_t m,
                        unsigned seg, ckz_err *err) {
    uint8_t lens[256];
    uint16_t freq[256];
    size_t used = 0;
    if (mode == CKZ_MODE_HUFF ? ckz_huf_read_table(body, len, lens, &used, err)
                              : ckz_rans_read_table(body, len, freq, &used, err))
        return -1;
    const uint8_t *p = body + used, *end = body + len;
    if (mode == CKZ_MODE_RANS32) return ckz_rans32_decode(freq, p, (size_t)(end - p), out, m, err);
    const uint8_t *in[CKZ_HUF_STREAMS];
    size_t size[CKZ_HUF_STREAMS];
    for (unsigned k = 0; k + 1 < CKZ_HUF_STREAMS; k++) {
        uint64_t v = 0;
        if (ckz_get_varint(&p, end, &v, "a stream size", err)) return -1;
        size[k] = (size_t)v;
    }
    for (unsigned k = 0; k < CKZ_HUF_STREAMS; k++) {
        size_t left = (size_t)(end - p);
        if (k + 1 == CKZ_HUF_STREAMS) size[k] = left;
        if (size[k] > left)
            return ckz_fail(err, "segment %u: stream %u needs %zu bytes, %zu left", seg, k,
                            size[k], left);
        in[k] = p;
        p += size[k];
    }
    if (mode == CKZ_MODE_RANS) return ckz_rans_decode(freq, in, size, out, m, err);
    ckz_huf_dtable t;
    ckz_huf_build_dtable(lens, &t);
    return ckz_huf_decode(&t, in, size, out, m, err);
}

int ckz_get_segment(const uint8_t **pp, const uint8_t *end, uint8_t *out, size_t m,
                    unsigned seg, ckz_err *err) {
    const uint8_t *p = *pp;
    size_t body = 0;
    if (p == end) return ckz_fail(err, "stream truncated in the mode of segment %u", seg);
    unsigned mode = *p++;
    switch (mode) {
    case CKZ_MODE_RAW:
        if (m > (size_t)(end - p))
            return ckz_fail(err, "stream truncated: RAW segment %u needs %zu bytes, %zu left", seg,
                            m, (size_t)(end - p));
        memcpy(out, p, m);
        p += m;
        break;
    case CKZ_MODE_CONST:
        if (p == end) return ckz_fail(err, "stream truncated in the value of segment %u", seg);
        memset(out, *p++, m);
        break;
    case CKZ_MODE_HUFF:
    case CKZ_MODE_RANS:
    case CKZ_MODE_RANS32:
        if (get_body_length(&p, end, seg, &body, err)) return -1;
        if (decode_coded(mode, p, body, out, m, seg, err)) return -1;
        p += body;
        break;
    default: return ckz_fail(err, "segment %u has unknown mode %u", seg, mode);
    }
    *pp = p;
    return 0;
}

int ckz_stream_decoded_size(const uint8_t *src, size_t len, uint64_t *n, ckz_err *err) {
    header h;
    h.n = 0; /* GCC 12 cannot see that parse_header sets it on success */
    if (parse_header(src, len, &h, err)) return -1;
    *n = h.n;
    return 0;
}

static int check_dst(const header *h, size_t dst_len, ckz_err *err) {
    if (h->n != dst_len)
        return ckz_fail(err, "destination holds %zu bytes but the stream decodes to %llu",
                        dst_len, (unsigned long long)h->n);
    return 0;
}

int ckz_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t dst_len, ckz_err *err) {
    header h;
    if (parse_header(src, len, &h, err) || check_dst(&h, dst_len, err)) return -1;
    size_t m = h.seg_len;
    for (unsigned j = 0; j < h.segments; j++) {
        uint8_t *out = dst + j * m;
        if (h.mode[j] == CKZ_MODE_RAW) memcpy(out, h.body[j], m);
        else if (h.mode[j] == CKZ_MODE_CONST) memset(out, h.value[j], m);
        else if (decode_coded(h.mode[j], h.body[j], h.body_len[j], out, m, j, err)) return -1;
    }
    return 0;
}

/* Plane j of a parsed stream into *plane: a RAW plane read where it lies in the stream, else
 * filled (CONST) or decoded into the scratch at *next, which moves on by m. */
static int decode_plane(const header *h, unsigned j, const uint8_t **plane, uint8_t **next,
                        size_t m, ckz_err *err) {
    if (h->mode[j] == CKZ_MODE_RAW) {
        *plane = h->body[j];
        return 0;
    }
    uint8_t *out = *next;
    *plane = out;
    *next += m;
    if (h->mode[j] == CKZ_MODE_CONST) {
        memset(out, h->value[j], m);
        return 0;
    }
    return decode_coded(h->mode[j], h->body[j], h->body_len[j], out, m, j, err);
}

/* Planes of a parsed stream that are not RAW (each needs a scratch plane). */
static unsigned scratch_planes(const header *h) {
    unsigned count = 0;
    for (unsigned j = 0; j < h->segments; j++) count += h->mode[j] != CKZ_MODE_RAW;
    return count;
}

/* The RANS32 body of a segment: its table read and its decode table built into T, the stream
 * after the table at *in, *len bytes. */
static int rans32_body(const uint8_t *body, size_t body_len, uint32_t *T, const uint8_t **in,
                       size_t *len, ckz_err *err) {
    uint16_t freq[256];
    size_t used = 0;
    if (ckz_rans_read_table(body, body_len, freq, &used, err)) return -1;
    ckz_rans_build_dtable(freq, T);
    *in = body + used;
    *len = body_len - used;
    return 0;
}

int ckz_decode_planes2(const uint8_t *const src[2], const size_t len[2], uint8_t *const dst[2],
                       size_t dst_len, unsigned elem_size, unsigned rotate) {
    header h[2];
    ckz_err err;
    for (unsigned c = 0; c < 2; c++)
        if (parse_header(src[c], len[c], &h[c], &err) || check_dst(&h[c], dst_len, &err) ||
            h[c].segments != elem_size)
            return -1;
    size_t m = h[0].seg_len; /* = h[1].seg_len: both decode to dst_len bytes */
    if (!m) return 0;
    unsigned coded = scratch_planes(&h[0]) + scratch_planes(&h[1]);
    uint8_t *scratch = NULL;
    if (coded) {
        /* <= 2 dst_len: bounded by the caller's buffers */
        scratch = ckz_scratch_get(CKZ_SCRATCH_DECODE, coded * m);
        if (!scratch) return -1;
    }
    const uint8_t *planes[2][CKZ_MAX_SEGMENTS];
    uint8_t *next = scratch;
    int rc = 0;
    uint32_t tables[2][CKZ_RANS_PROB_SCALE]; /* 32 KiB: as ckz_rans32_decode, on the stack */
    for (unsigned j = 0; j < elem_size && !rc; j++) {
        if (h[0].mode[j] == CKZ_MODE_RANS32 && h[1].mode[j] == CKZ_MODE_RANS32) {
            const uint8_t *in[2];
            size_t in_len[2];
            uint8_t *out[2] = {next, next + m};
            rc = rans32_body(h[0].body[j], h[0].body_len[j], tables[0], &in[0], &in_len[0], &err) ||
                 rans32_body(h[1].body[j], h[1].body_len[j], tables[1], &in[1], &in_len[1], &err);
            if (!rc) {
                const uint32_t *T[2] = {tables[0], tables[1]};
                const unsigned shift[2] = {0, 0};
                rc = ckz_rans32_decode_tab2(T, NULL, shift, in, in_len, out, m, &err);
            }
            planes[0][j] = out[0];
            planes[1][j] = out[1];
            next += 2 * m;
            continue;
        }
        for (unsigned c = 0; c < 2 && !rc; c++)
            rc = decode_plane(&h[c], j, &planes[c][j], &next, m, &err);
    }
    if (!rc) {
        ckz_merge_planes(planes[0], dst[0], m, elem_size, rotate);
        ckz_merge_planes(planes[1], dst[1], m, elem_size, rotate);
    }
    if (scratch) ckz_scratch_put(CKZ_SCRATCH_DECODE, scratch);
    return rc ? -1 : 0;
}

int ckz_decode_planes(const uint8_t *src, size_t len, uint8_t *dst, size_t dst_len,
                      unsigned elem_size, unsigned rotate, ckz_err *err) {
    header h;
    if (parse_header(src, len, &h, err) || check_dst(&h, dst_len, err)) return -1;
    if (h.segments != elem_size)
        return ckz_fail(err, "stream has %u segments but elem_size is %u", h.segments,
                        elem_size);
    size_t m = h.seg_len;
    if (!m) return 0;
    /* RAW planes are merged straight from the stream; the others get a scratch plane each. */
    unsigned coded = scratch_planes(&h);
    uint8_t *scratch = NULL;
    if (coded) {
        /* <= dst_len: bounded by the caller's buffer */
        scratch = ckz_scratch_get(CKZ_SCRATCH_DECODE, coded * m);
        if (!scratch) return ckz_fail(err, "out of memory for %u planes of %zu bytes", coded, m);
    }
    const uint8_t *planes[CKZ_MAX_SEGMENTS];
    uint8_t *next = scratch;
    int rc = 0;
    for (unsigned j = 0; j < h.segments && !rc; j++)
        rc = decode_plane(&h, j, &planes[j], &next, m, err);
    if (!rc) ckz_merge_planes(planes, dst, m, elem_size, rotate);
    if (scratch) ckz_scratch_put(CKZ_SCRATCH_DECODE, scratch);
    return rc;
}
