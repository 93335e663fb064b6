/* module.c - Python bindings of the native core (ckptzip._native).  Argument parsing, buffer
 * handling and the GIL only; the work, and its policy, runs in the core (../core, chunk.h at its
 * top) with the GIL released. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#ifdef __linux__
#include <fcntl.h>
#endif

#include "chunk.h"
#include "common.h"
#include "crc32c.h"
#include "ctx.h"
#include "dither.h"
#include "hist.h"
#include "memory.h"
#include "planes.h"
#include "pymemory.h"
#include "quantize.h"
#include "masks.h"
#include "ratio.h"
#include "residual.h"
#include "search.h"
#include "sparse.h"
#include "stream.h"

/* A contiguous buffer held for the duration of a call. */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous %sbuffer, not %.100s", name,
                     writable ? "writable " : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static int overlaps(const Py_buffer *a, const Py_buffer *b) {
    const char *x = a->buf, *y = b->buf;
    return a->len && b->len && x < y + b->len && y < x + a->len;
}

/* Whether two buffers are the same bytes (an element-wise pass may write its input in place). */
static int same_memory(const Py_buffer *a, const Py_buffer *b) {
    return a->buf == b->buf && a->len == b->len;
}

static int check_elem(long elem_size, long rotate) {
    if (elem_size < 1 || elem_size > CKZ_MAX_ELEM_SIZE) {
        PyErr_Format(PyExc_ValueError, "elem_size %ld is outside 1..%d", elem_size,
                     CKZ_MAX_ELEM_SIZE);
        return -1;
    }
    if (rotate < 0 || rotate >= 8 * elem_size) {
        PyErr_Format(PyExc_ValueError, "rotate %ld is outside 0..%ld for elem_size %ld", rotate,
                     8 * elem_size - 1, elem_size);
        return -1;
    }
    return 0;
}

/* The element size of a float32 or float64 buffer: 0, or -1 with a ValueError set. */
static int check_float_size(long elem_size) {
    if (elem_size == 4 || elem_size == 8) return 0;
    PyErr_Format(PyExc_ValueError, "elem_size %ld is not 4 or 8", elem_size);
    return -1;
}

static int check_len(Py_ssize_t len, long elem_size, const char *name) {
    if (len % elem_size) {
        PyErr_Format(PyExc_ValueError, "%s length %zd is not a multiple of elem_size %ld", name,
                     len, elem_size);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, value=0) -> int\n\nCRC-32C of data, continuing from value.");
static PyObject *py_crc32c(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"data", "value", NULL};
    PyObject *obj;
    unsigned long value = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|k:crc32c", kwlist, &obj, &value)) return NULL;
    if (value > 0xffffffffUL)
        return PyErr_Format(PyExc_ValueError, "value %lu exceeds 32 bits", value);
    Py_buffer v;
    if (get_buffer(obj, &v, 0, "data")) return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = ckz_crc32c((uint32_t)value, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(bytes_equal_doc,
             "bytes_equal(a, b) -> bool\n\n"
             "Whether the buffers a and b hold the same bytes (memcmp, the GIL released).");
static PyObject *py_bytes_equal(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"a", "b", NULL};
    PyObject *ao, *bo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:bytes_equal", kwlist, &ao, &bo)) return NULL;
    Py_buffer a, b;
    if (get_buffer(ao, &a, 0, "a")) return NULL;
    if (get_buffer(bo, &b, 0, "b")) {
        PyBuffer_Release(&a);
        return NULL;
    }
    int same = a.len == b.len;
    if (same && a.len) {
        Py_BEGIN_ALLOW_THREADS
        same = memcmp(a.buf, b.buf, (size_t)a.len) == 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBool_FromLong(same);
}

PyDoc_STRVAR(byte_histogram_doc,
             "byte_histogram(data) -> tuple[tuple[int, ...], ...]\n\n"
             "The entropy coder's histogram of data: for each of the four quarters its Huffman\n"
             "streams are cut into, the count of every byte value (256 ints).  It is what the\n"
             "encoder plans with, exposed so that tests can hold its fast paths to np.bincount.");
static PyObject *py_byte_histogram(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"data", NULL};
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:byte_histogram", kwlist, &obj)) return NULL;
    Py_buffer v;
    if (get_buffer(obj, &v, 0, "data")) return NULL;
    uint32_t counts[CKZ_HIST_QUARTERS][256];
    Py_BEGIN_ALLOW_THREADS
    ckz_hist_count(v.buf, (size_t)v.len, counts);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    PyObject *out = PyTuple_New(CKZ_HIST_QUARTERS);
    if (!out) return NULL;
    for (unsigned k = 0; k < CKZ_HIST_QUARTERS; k++) {
        PyObject *row = PyTuple_New(256);
        if (!row) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, k, row);
        for (unsigned b = 0; b < 256; b++) {
            PyObject *c = PyLong_FromUnsignedLong(counts[k][b]);
            if (!c) { Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(row, b, c);
        }
    }
    return out;
}

PyDoc_STRVAR(dither_offsets_doc,
             "dither_offsets(dst, start, seed) -> None\n\n"
             "Fill dst (float64) with the dither offsets of elements start, start + 1, ... for\n"
             "seed (docs/FORMAT.md), each uniform in (-1/2, 1/2).");
static PyObject *py_dither_offsets(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"dst", "start", "seed", NULL};
    PyObject *obj;
    unsigned long long start;
    unsigned long seed;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OKk:dither_offsets", kwlist, &obj, &start, &seed))
        return NULL;
    if (seed > 0xffffffffUL)
        return PyErr_Format(PyExc_ValueError, "seed %lu exceeds 32 bits", seed);
    Py_buffer v;
    if (get_buffer(obj, &v, 1, "dst")) return NULL;
    if (check_len(v.len, 8, "dst")) {
        PyBuffer_Release(&v);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ckz_dither_offsets((double *)v.buf, (size_t)v.len / 8, (uint64_t)start, (uint32_t)seed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(dither_shift_doc,
             "dither_shift(src, dst, elem_size, seed, step, sign) -> None\n\n"
             "dst[i] = src[i] + sign * offset(i, seed) * step in float64 arithmetic, rounded once to\n"
             "the elements' type (float32 or float64 by elem_size; sign 1 or -1): the dither stage\n"
             "over a whole tensor. dst may be src.");
static PyObject *py_dither_shift(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "dst", "elem_size", "seed", "step", "sign", NULL};
    PyObject *so, *dobj;
    long elem_size;
    unsigned long seed;
    double step;
    int sign;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOlkdi:dither_shift", kwlist, &so, &dobj,
                                     &elem_size, &seed, &step, &sign))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    if (sign != 1 && sign != -1) return PyErr_Format(PyExc_ValueError, "sign %d is not 1 or -1", sign);
    if (seed > 0xffffffffUL)
        return PyErr_Format(PyExc_ValueError, "seed %lu exceeds 32 bits", seed);
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(s.len, elem_size, "src") == 0) {
        if (d.len != s.len)
            PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, src %zd", d.len, s.len);
        else if (overlaps(&s, &d) && s.buf != d.buf)
            PyErr_SetString(PyExc_ValueError, "src and dst overlap without being the same");
        else {
            Py_BEGIN_ALLOW_THREADS
            ckz_dither_shift(s.buf, d.buf, (size_t)elem_size, (size_t)s.len / (size_t)elem_size,
                             (uint32_t)seed, step, sign);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

PyDoc_STRVAR(uniform_bins_doc,
             "uniform_bins(src, pruned, sums, counts, elem_size, step, offset, limit) -> int\n\n"
             "The uniform quantizer's levels sign(x) floor(|x| / step + offset) of src (float32 or\n"
             "float64): per level -limit..limit but 0, the sum (sums, float64) and number (counts,\n"
             "uint64) of its values (level 0's stay 0); pruned = src with level 0 zeroed. Returns\n"
             "the largest |level|,\n"
             "or -1 when a level is beyond limit (nothing is then meaningful).");
static PyObject *py_uniform_bins(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "pruned", "sums", "counts", "elem_size", "step", "offset",
                             "limit", NULL};
    PyObject *so, *po, *sumo, *co;
    long elem_size;
    double step, offset;
    unsigned int limit;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOlddI:uniform_bins", kwlist, &so, &po, &sumo,
                                     &co, &elem_size, &step, &offset, &limit))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    if (limit > CKZ_MAX_UNIFORM_LEVEL || !(step > 0) || !(offset >= 0 && offset < 1))
        return PyErr_Format(PyExc_ValueError, "need 0 < step, 0 <= offset < 1 and limit <= %d",
                            CKZ_MAX_UNIFORM_LEVEL);
    Py_buffer s, p, sums, counts;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(po, &p, 1, "pruned")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (get_buffer(sumo, &sums, 1, "sums")) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&p);
        return NULL;
    }
    if (get_buffer(co, &counts, 1, "counts")) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&p);
        PyBuffer_Release(&sums);
        return NULL;
    }
    PyObject *result = NULL;
    size_t bins = 2 * (size_t)limit + 1;
    if (check_len(s.len, elem_size, "src") == 0) {
        if (p.len != s.len)
            PyErr_Format(PyExc_ValueError, "pruned holds %zd bytes, src %zd", p.len, s.len);
        else if ((size_t)sums.len != 8 * bins || (size_t)counts.len != 8 * bins)
            PyErr_Format(PyExc_ValueError, "sums and counts must hold %zu 8-byte values", bins);
        else if (overlaps(&s, &p) || overlaps(&sums, &counts) || overlaps(&s, &sums) ||
                 overlaps(&s, &counts) || overlaps(&p, &sums) || overlaps(&p, &counts))
            PyErr_SetString(PyExc_ValueError, "the buffers overlap");
        else {
            long top;
            Py_BEGIN_ALLOW_THREADS
            top = ckz_uniform_bins(s.buf, (size_t)elem_size, (size_t)s.len / (size_t)elem_size,
                                   step, offset, limit, p.buf, (double *)sums.buf,
                                   (uint64_t *)counts.buf);
            Py_END_ALLOW_THREADS
            result = PyLong_FromLong(top);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&p);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&counts);
    return result;
}

PyDoc_STRVAR(sum_squares_doc,
             "sum_squares(a, b, elem_size) -> float\n\n"
             "The sum of a[i]^2 (b None) or of (a[i] - b[i])^2 over float32 or float64 values (by\n"
             "elem_size), the difference in the element type, squares summed in float64.");
static PyObject *py_sum_squares(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"a", "b", "elem_size", NULL};
    PyObject *ao, *bo;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOl:sum_squares", kwlist, &ao, &bo, &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer a, b;
    int with_b = bo != Py_None;
    if (get_buffer(ao, &a, 0, "a")) return NULL;
    if (with_b && get_buffer(bo, &b, 0, "b")) {
        PyBuffer_Release(&a);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(a.len, elem_size, "a") == 0) {
        if (with_b && b.len != a.len)
            PyErr_Format(PyExc_ValueError, "b holds %zd bytes, a %zd", b.len, a.len);
        else {
            double total;
            Py_BEGIN_ALLOW_THREADS
            total = ckz_sum_squares(a.buf, with_b ? b.buf : NULL, (size_t)elem_size,
                                    (size_t)a.len / (size_t)elem_size);
            Py_END_ALLOW_THREADS
            result = PyFloat_FromDouble(total);
        }
    }
    PyBuffer_Release(&a);
    if (with_b) PyBuffer_Release(&b);
    return result;
}

/* A float32 buffer: 0, or -1 with a ValueError set. */
static int check_floats(const Py_buffer *view, const char *name) {
    if (view->len % 4) {
        PyErr_Format(PyExc_ValueError, "%s must hold float32 values, not %zd bytes", name,
                     view->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(rounding_spread_doc,
             "rounding_spread(x, step) -> (mean, spread)\n\n"
             "For float32 x and f the fraction of |x| / step past its lower multiple: the sums of\n"
             "f (1 - f) and of f (1 - f) (1 - 2 f)^2 (unbiased rounding's expected squared error\n"
             "and its variance, in units of step^2 and step^4).");
static PyObject *py_rounding_spread(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "step", NULL};
    PyObject *xo;
    double step;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Od:rounding_spread", kwlist, &xo, &step))
        return NULL;
    if (!(step > 0)) return PyErr_Format(PyExc_ValueError, "step must be > 0, not %g", step);
    Py_buffer x;
    if (get_buffer(xo, &x, 0, "x")) return NULL;
    PyObject *result = NULL;
    if (check_floats(&x, "x") == 0) {
        double mean, spread;
        Py_BEGIN_ALLOW_THREADS
        ckz_rounding_spread((const float *)x.buf, (size_t)x.len / 4, step, &mean, &spread);
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("(dd)", mean, spread);
    }
    PyBuffer_Release(&x);
    return result;
}

PyDoc_STRVAR(step_bisect_doc,
             "step_bisect(x, fraction, sigmas, target, fine, coarse, tolerance, rounds) -> float\n\n"
             "modes/factoring.py _sample_step's bisection over the float32 magnitudes x: while\n"
             "coarse > fine (1 + tolerance), at most rounds times, the geometric middle replaces\n"
             "fine where unbiased rounding's expected squared error plus sigmas deviations is at\n"
             "most target, else coarse. Returns fine (which must be > 0).");
static PyObject *py_step_bisect(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "fraction", "sigmas", "target", "fine", "coarse", "tolerance",
                             "rounds", NULL};
    PyObject *xo;
    double fraction, sigmas, target, fine, coarse, tolerance;
    unsigned rounds;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OddddddI:step_bisect", kwlist, &xo, &fraction,
                                     &sigmas, &target, &fine, &coarse, &tolerance, &rounds))
        return NULL;
    if (!(fine > 0) || !(tolerance >= 0) || rounds > 1024)
        return PyErr_Format(PyExc_ValueError,
                            "need fine > 0, tolerance >= 0 and at most 1024 rounds");
    Py_buffer x;
    if (get_buffer(xo, &x, 0, "x")) return NULL;
    PyObject *result = NULL;
    if (check_floats(&x, "x") == 0) {
        double step;
        Py_BEGIN_ALLOW_THREADS
        step = ckz_step_bisect((const float *)x.buf, (size_t)x.len / 4, fraction, sigmas, target,
                               fine, coarse, tolerance, rounds);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(step);
    }
    PyBuffer_Release(&x);
    return result;
}

PyDoc_STRVAR(level_bits_doc,
             "level_bits(x, step, limit) -> float\n\n"
             "The expected order-0 entropy, in bits for all values, of float32 x rounded without\n"
             "bias to multiples of step (a value at fraction f past a level rounds up with\n"
             "probability f); -1.0 when the levels span more than limit or a value is not finite.");
static PyObject *py_level_bits(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "step", "limit", NULL};
    PyObject *xo;
    double step;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Odn:level_bits", kwlist, &xo, &step, &limit))
        return NULL;
    if (!(step > 0) || limit < 2)
        return PyErr_Format(PyExc_ValueError, "need step > 0 and limit >= 2, not %g and %zd",
                            step, limit);
    Py_buffer x;
    if (get_buffer(xo, &x, 0, "x")) return NULL;
    PyObject *result = NULL;
    if (check_floats(&x, "x") == 0) {
        double bits;
        Py_BEGIN_ALLOW_THREADS
        bits = ckz_level_bits((const float *)x.buf, (size_t)x.len / 4, step, (size_t)limit);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(bits);
    }
    PyBuffer_Release(&x);
    return result;
}

PyDoc_STRVAR(lloyd_sorted_doc,
             "lloyd_sorted(values, k, iterations, centroids, counts) -> (m, sse)\n\n"
             "1-D k-means of ascending float64 values into at most k (1..255) clusters (the\n"
             "arithmetic of codecs/kmeans.py's lloyd_sorted): writes m ascending centroids into\n"
             "centroids (float64, k of them) and their populations into counts (int64, k); sse is\n"
             "the squared error.");
static PyObject *py_lloyd_sorted(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"values", "k", "iterations", "centroids", "counts", NULL};
    PyObject *vo, *co, *no;
    unsigned int k, iterations;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIOO:lloyd_sorted", kwlist, &vo, &k,
                                     &iterations, &co, &no))
        return NULL;
    if (k < 1 || k > CKZ_MAX_CENTROIDS)
        return PyErr_Format(PyExc_ValueError, "k must be within 1..%d, not %u",
                            CKZ_MAX_CENTROIDS, k);
    Py_buffer v, c, counts;
    if (get_buffer(vo, &v, 0, "values")) return NULL;
    if (get_buffer(co, &c, 1, "centroids")) {
        PyBuffer_Release(&v);
        return NULL;
    }
    if (get_buffer(no, &counts, 1, "counts")) {
        PyBuffer_Release(&v);
        PyBuffer_Release(&c);
        return NULL;
    }
    PyObject *result = NULL;
    if (v.len % 8)
        PyErr_Format(PyExc_ValueError, "values must hold float64 values, not %zd bytes", v.len);
    else if ((size_t)c.len != 8 * (size_t)k || (size_t)counts.len != 8 * (size_t)k)
        PyErr_Format(PyExc_ValueError, "centroids and counts must hold %u 8-byte values", k);
    else if (overlaps(&v, &c) || overlaps(&v, &counts) || overlaps(&c, &counts))
        PyErr_SetString(PyExc_ValueError, "the buffers overlap");
    else {
        long m;
        double sse;
        Py_BEGIN_ALLOW_THREADS
        m = ckz_lloyd_sorted((const double *)v.buf, (size_t)v.len / 8, k, iterations,
                             (double *)c.buf, (int64_t *)counts.buf, &sse);
        Py_END_ALLOW_THREADS
        if (m < 0) PyErr_NoMemory();
        else result = Py_BuildValue("(ld)", m, sse);
    }
    PyBuffer_Release(&v);
    PyBuffer_Release(&c);
    PyBuffer_Release(&counts);
    return result;
}

PyDoc_STRVAR(uniform_candidate_doc,
             "uniform_candidate(sorted, sums, squares, step, offset, levels)\n"
             "    -> (zero_count, used, bits, sse)\n\n"
             "One uniform quantizer of the adaptive search over ascending float64 values with\n"
             "their prefix sums and prefix sums of squares (one more entry each, from 0): bins split\n"
             "at +-(j - offset) step, j = 1..levels (at most 127), each at its mean, the middle at\n"
             "zero. The values in the zero bin, the other bins used, the bins' order-0 entropy in\n"
             "bits, and the squared error.");
static PyObject *py_uniform_candidate(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"sorted", "sums", "squares", "step", "offset", "levels", NULL};
    PyObject *vo, *so, *qo;
    double step, offset;
    long levels;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOddl:uniform_candidate", kwlist, &vo, &so, &qo,
                                     &step, &offset, &levels))
        return NULL;
    if (!(step > 0) || !(offset >= 0 && offset < 1) || levels < 0 || levels > 127)
        return PyErr_Format(PyExc_ValueError,
                            "need step > 0, 0 <= offset < 1 and 0 <= levels <= 127");
    Py_buffer v, sums, squares;
    if (get_buffer(vo, &v, 0, "sorted")) return NULL;
    if (get_buffer(so, &sums, 0, "sums")) {
        PyBuffer_Release(&v);
        return NULL;
    }
    if (get_buffer(qo, &squares, 0, "squares")) {
        PyBuffer_Release(&v);
        PyBuffer_Release(&sums);
        return NULL;
    }
    PyObject *result = NULL;
    if (v.len % 8 || sums.len != v.len + 8 || squares.len != v.len + 8)
        PyErr_Format(PyExc_ValueError, "sorted must hold float64 values and sums and squares "
                     "one more each (%zd, %zd and %zd bytes)", v.len, sums.len, squares.len);
    else {
        double out[4];
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = ckz_uniform_candidate((const double *)v.buf, (const double *)sums.buf,
                                       (const double *)squares.buf, (size_t)v.len / 8, step,
                                       offset, levels, out);
        Py_END_ALLOW_THREADS
        if (failed) PyErr_SetString(PyExc_ValueError, "uniform_candidate: bad arguments");
        else result = Py_BuildValue("(nndd)", (Py_ssize_t)out[0], (Py_ssize_t)out[1], out[2],
                                    out[3]);
    }
    PyBuffer_Release(&v);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&squares);
    return result;
}

PyDoc_STRVAR(quantize_search_doc,
             "quantize_search(ordered, scale_sq, budget, kmeans, fractions, codebooks, offsets,\n"
             "                coarsest, finest, bisections, samples, iterations)\n"
             "    -> (kept, k, bits, error, step, offset) or None\n\n"
             "modes/quantize.py search after its sort, over ascending float64 values: the same\n"
             "choice, bit for bit. fractions and offsets are float64, codebooks int64 (1..255).\n"
             "None where it does not take the values (one not finite, a budget not >= 0,\n"
             "scale_sq not > 0): Python's search runs then.");
static PyObject *py_quantize_search(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"ordered", "scale_sq", "budget", "kmeans", "fractions", "codebooks",
                             "offsets", "coarsest", "finest", "bisections", "samples",
                             "iterations", NULL};
    PyObject *vo, *fo, *co, *oo;
    double scale_sq, budget, coarsest, finest;
    int kmeans;
    unsigned bisections, iterations;
    Py_ssize_t samples;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OddpOOOddInI:quantize_search", kwlist, &vo,
                                     &scale_sq, &budget, &kmeans, &fo, &co, &oo, &coarsest,
                                     &finest, &bisections, &samples, &iterations))
        return NULL;
    if (samples < 1) return PyErr_Format(PyExc_ValueError, "samples must be at least 1");
    Py_buffer v, f, c, o;
    if (get_buffer(vo, &v, 0, "ordered")) return NULL;
    if (get_buffer(fo, &f, 0, "fractions")) {
        PyBuffer_Release(&v);
        return NULL;
    }
    if (get_buffer(co, &c, 0, "codebooks")) {
        PyBuffer_Release(&v);
        PyBuffer_Release(&f);
        return NULL;
    }
    if (get_buffer(oo, &o, 0, "offsets")) {
        PyBuffer_Release(&v);
        PyBuffer_Release(&f);
        PyBuffer_Release(&c);
        return NULL;
    }
    PyObject *result = NULL;
    if (v.len % 8 || f.len % 8 || c.len % 8 || o.len % 8) {
        PyErr_SetString(PyExc_ValueError, "ordered, fractions, codebooks and offsets must hold "
                        "8-byte elements");
    } else {
        ckz_search_spec spec = {(const double *)f.buf, (size_t)f.len / 8,
                                (const int64_t *)c.buf, (size_t)c.len / 8,
                                (const double *)o.buf, (size_t)o.len / 8,
                                coarsest, finest, bisections, (size_t)samples, iterations};
        ckz_choice choice;
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = ckz_quantize_search((const double *)v.buf, (size_t)v.len / 8, scale_sq, budget,
                                     kmeans, &spec, &choice);
        Py_END_ALLOW_THREADS
        if (status == -1) PyErr_NoMemory();
        else if (status == -3)
            PyErr_SetString(PyExc_ValueError, "quantize_search: fractions must be in [0, 1], "
                            "codebooks in 1..255, offsets in [0, 1), 0 < finest <= coarsest, "
                            "at most 64 bisections, samples and iterations at least 1");
        else if (status == -2) result = Py_NewRef(Py_None);
        else result = Py_BuildValue("(nndddd)", (Py_ssize_t)choice.kept, (Py_ssize_t)choice.k,
                                    choice.bits, choice.error, choice.step, choice.offset);
    }
    PyBuffer_Release(&v);
    PyBuffer_Release(&f);
    PyBuffer_Release(&c);
    PyBuffer_Release(&o);
    return result;
}

PyDoc_STRVAR(round_levels_doc,
             "round_levels(src, levels, counts, elem_size, step, seed, dithered) -> int\n\n"
             "The adaptive mode's unbiased rounding of float32 or float64 src (by elem_size) to\n"
             "multiples of step: with a subtractive dither of seed (dithered), else stochastically\n"
             "with the draws of seed; levels (int8) and counts (255 uint64, level + 127) written.\n"
             "The largest |level|, or -1 beyond 127 or at a NaN (nothing meaningful then).");
static PyObject *py_round_levels(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "levels", "counts", "elem_size", "step", "seed", "dithered",
                             NULL};
    PyObject *so, *lo, *co;
    long elem_size;
    double step;
    unsigned long seed;
    int dithered;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOldkp:round_levels", kwlist, &so, &lo, &co,
                                     &elem_size, &step, &seed, &dithered))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    if (!(step > 0) || seed > 0xFFFFFFFFul)
        return PyErr_Format(PyExc_ValueError, "need step > 0 and a 32-bit seed");
    Py_buffer s, l, c;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(lo, &l, 1, "levels")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (get_buffer(co, &c, 1, "counts")) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&l);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(s.len, elem_size, "src") == 0) {
        size_t n = (size_t)s.len / (size_t)elem_size;
        if ((size_t)l.len != n)
            PyErr_Format(PyExc_ValueError, "levels holds %zd bytes for %zu values", l.len, n);
        else if (c.len != 255 * 8)
            PyErr_SetString(PyExc_ValueError, "counts must hold 255 uint64 values");
        else if (overlaps(&s, &l) || overlaps(&s, &c) || overlaps(&l, &c))
            PyErr_SetString(PyExc_ValueError, "the buffers overlap");
        else {
            long top;
            Py_BEGIN_ALLOW_THREADS
            top = ckz_round_levels(s.buf, (size_t)elem_size, n, step, (uint32_t)seed, dithered,
                                   (int8_t *)l.buf, (uint64_t *)c.buf);
            Py_END_ALLOW_THREADS
            result = PyLong_FromLong(top);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&l);
    PyBuffer_Release(&c);
    return result;
}

/* A buffer of doubles (thresholds, a codebook) of at most `most` entries. */
static int get_doubles(PyObject *obj, Py_buffer *view, size_t most, const char *name) {
    if (get_buffer(obj, view, 0, name)) return -1;
    if (view->len % 8 || (size_t)view->len / 8 > most) {
        PyErr_Format(PyExc_ValueError, "%s must hold at most %zu float64 values, not %zd bytes",
                     name, most, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(nearest_codes_doc,
             "nearest_codes(src, thresholds, dst, elem_size) -> None\n\n"
             "dst[i] (uint8) = 0 where src[i] (float32 or float64, by elem_size) is zero, else 1 +\n"
             "the number of the ascending float64 thresholds (at most 254) below it: the code of\n"
             "the nearest entry of a sorted codebook, given the midpoints between its entries.");
static PyObject *py_nearest_codes(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "thresholds", "dst", "elem_size", NULL};
    PyObject *so, *to, *dobj;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOl:nearest_codes", kwlist, &so, &to, &dobj,
                                     &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer s, t, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_doubles(to, &t, CKZ_MAX_CENTROIDS - 1, "thresholds")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&t);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(s.len, elem_size, "src") == 0) {
        size_t n = (size_t)s.len / (size_t)elem_size;
        if ((size_t)d.len != n)
            PyErr_Format(PyExc_ValueError, "dst holds %zd codes for %zu values", d.len, n);
        else if (overlaps(&s, &d))
            PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        else {
            Py_BEGIN_ALLOW_THREADS
            ckz_nearest_codes(s.buf, (size_t)elem_size, n, (const double *)t.buf,
                              (size_t)t.len / 8, (uint8_t *)d.buf);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&t);
    PyBuffer_Release(&d);
    return result;
}

PyDoc_STRVAR(table_lookup_doc,
             "table_lookup(codes, table, dst, elem_size) -> int\n\n"
             "dst[i] = table[codes[i]] (codes uint8, table float64 of at most 256 entries, dst\n"
             "float32 or float64 by elem_size). Returns len(codes), or the index of the first code\n"
             "beyond the table (dst is then meaningless).");
static PyObject *py_table_lookup(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"codes", "table", "dst", "elem_size", NULL};
    PyObject *co, *to, *dobj;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOl:table_lookup", kwlist, &co, &to, &dobj,
                                     &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer c, t, d;
    if (get_buffer(co, &c, 0, "codes")) return NULL;
    if (get_doubles(to, &t, 256, "table")) {
        PyBuffer_Release(&c);
        return NULL;
    }
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&c);
        PyBuffer_Release(&t);
        return NULL;
    }
    PyObject *result = NULL;
    size_t n = (size_t)c.len;
    if ((size_t)d.len != n * (size_t)elem_size)
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes for %zu values of %ld bytes", d.len,
                     n, elem_size);
    else if (overlaps(&c, &d))
        PyErr_SetString(PyExc_ValueError, "codes and dst overlap");
    else {
        size_t done;
        Py_BEGIN_ALLOW_THREADS
        done = ckz_table_lookup((const uint8_t *)c.buf, n, (const double *)t.buf,
                                (size_t)t.len / 8, (size_t)elem_size, d.buf);
        Py_END_ALLOW_THREADS
        result = PyLong_FromSize_t(done);
    }
    PyBuffer_Release(&c);
    PyBuffer_Release(&t);
    PyBuffer_Release(&d);
    return result;
}

/* The sparse stage: the largest |scale_exp| a file may name (as the kmeans codebook's). */
#define SPARSE_MAX_SCALE 1000

PyDoc_STRVAR(sparse_survey_doc,
             "sparse_survey(src) -> (count, max_abs)\n\n"
             "The number of non-zero float32 values in src (-0.0 is zero, a NaN is not) and the\n"
             "largest magnitude among them (NaN where one is NaN, 0.0 where there are none).");
static PyObject *py_sparse_survey(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", NULL};
    PyObject *so;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:sparse_survey", kwlist, &so)) return NULL;
    Py_buffer s;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    PyObject *result = NULL;
    if (check_len(s.len, 4, "src") == 0) {
        size_t count;
        double top;
        Py_BEGIN_ALLOW_THREADS
        count = ckz_sparse_survey((const float *)s.buf, (size_t)s.len / 4, &top);
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("nd", (Py_ssize_t)count, top);
    }
    PyBuffer_Release(&s);
    return result;
}

PyDoc_STRVAR(writeback_doc,
             "writeback(fd, offset, length) -> bool\n\n"
             "Have the kernel start writing the file's bytes [offset, offset + length) to disk, without\n"
             "waiting for them (Linux's sync_file_range with SYNC_FILE_RANGE_WRITE), so that a later\n"
             "fsync finds most of them written. True when the request was taken; False where the\n"
             "system or the file cannot (another OS, a pipe): nothing is lost, fsync does it all.");

static PyObject *py_writeback(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"fd", "offset", "length", NULL};
    int fd;
    long long offset, length;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iLL:writeback", kwlist, &fd, &offset, &length))
        return NULL;
    if (fd < 0 || offset < 0 || length < 0) {
        PyErr_SetString(PyExc_ValueError, "writeback: fd, offset and length must be >= 0");
        return NULL;
    }
    int taken = 0;
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sync_file_range(fd, (off_t)offset, (off_t)length, SYNC_FILE_RANGE_WRITE);
    Py_END_ALLOW_THREADS
    taken = rc == 0;
#endif
    return PyBool_FromLong(taken);
}

PyDoc_STRVAR(sparse_pack_doc,
             "sparse_pack(src, scale_exp, dst) -> int\n\n"
             "The sparse stage's bytes of the float32 values src: dst (uint8) gets the bitmask of\n"
             "the non-zeros ((len(src) + 7) // 8 bytes), then the low and then the high bytes of\n"
             "each non-zero times 2**-scale_exp as fp16 (torch's rounding), `count` bytes each,\n"
             "where len(dst) = mask + 2 count. Returns count; ValueError where src has more\n"
             "non-zeros than dst holds.");
static PyObject *py_sparse_pack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "scale_exp", "dst", NULL};
    PyObject *so, *dobj;
    int scale_exp;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiO:sparse_pack", kwlist, &so, &scale_exp, &dobj))
        return NULL;
    if (scale_exp < -SPARSE_MAX_SCALE || scale_exp > SPARSE_MAX_SCALE)
        return PyErr_Format(PyExc_ValueError, "scale_exp %d is outside -%d..%d", scale_exp,
                            SPARSE_MAX_SCALE, SPARSE_MAX_SCALE);
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(s.len, 4, "src") == 0) {
        size_t n = (size_t)s.len / 4, mask = (n + 7) / 8, len = (size_t)d.len;
        if (len < mask || (len - mask) % 2)
            PyErr_Format(PyExc_ValueError, "dst holds %zd bytes: not a %zu-byte mask and two "
                         "planes of equal size", d.len, mask);
        else if (overlaps(&s, &d))
            PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        else {
            size_t capacity = (len - mask) / 2, count;
            uint8_t *out = (uint8_t *)d.buf;
            Py_BEGIN_ALLOW_THREADS
            count = ckz_sparse_pack((const float *)s.buf, n, scale_exp, out, out + mask,
                                    out + mask + capacity, capacity);
            Py_END_ALLOW_THREADS
            if (count == (size_t)-1)
                PyErr_Format(PyExc_ValueError, "src has more than %zu non-zeros", capacity);
            else if (count != capacity)
                PyErr_Format(PyExc_ValueError, "src has %zu non-zeros, dst room for %zu", count,
                             capacity);
            else
                result = PyLong_FromSize_t(count);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

PyDoc_STRVAR(sparse_unpack_doc,
             "sparse_unpack(src, count, scale_exp, dst) -> bool\n\n"
             "The inverse of sparse_pack: dst (float32, n values) gets 0.0 where the mask bit is\n"
             "clear and the k-th fp16 value times 2**scale_exp at the k-th set bit; src holds\n"
             "(n + 7) // 8 mask bytes and two planes of count bytes. False where the mask does not\n"
             "mark exactly count of the n elements (dst is then meaningless).");
static PyObject *py_sparse_unpack(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "count", "scale_exp", "dst", NULL};
    PyObject *so, *dobj;
    Py_ssize_t count;
    int scale_exp;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OniO:sparse_unpack", kwlist, &so, &count,
                                     &scale_exp, &dobj))
        return NULL;
    if (scale_exp < -SPARSE_MAX_SCALE || scale_exp > SPARSE_MAX_SCALE || count < 0)
        return PyErr_Format(PyExc_ValueError, "bad count %zd or scale_exp %d", count, scale_exp);
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(d.len, 4, "dst") == 0) {
        size_t n = (size_t)d.len / 4, mask = (n + 7) / 8;
        if ((size_t)count > n || (size_t)s.len != mask + 2 * (size_t)count)
            PyErr_Format(PyExc_ValueError, "src holds %zd bytes, not a %zu-byte mask and two "
                         "planes of %zd for %zu values", s.len, mask, count, n);
        else if (overlaps(&s, &d))
            PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        else {
            const uint8_t *in = (const uint8_t *)s.buf;
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = ckz_sparse_unpack(in, in + mask, in + mask + count, (size_t)count, n,
                                       scale_exp, (float *)d.buf);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(status == 0);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

PyDoc_STRVAR(spread_gather_doc,
             "spread_gather(src, dst, elem_size, stride) -> None\n\n"
             "dst[i] = src[(i * stride) mod n] for every element of dst (n the elements of src,\n"
             "each elem_size bytes; 0 <= stride < n).");
static PyObject *py_spread_gather(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "dst", "elem_size", "stride", NULL};
    PyObject *so, *dobj;
    long elem_size;
    unsigned long long stride;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOlK:spread_gather", kwlist, &so, &dobj,
                                     &elem_size, &stride))
        return NULL;
    if (elem_size < 1 || elem_size > 16)
        return PyErr_Format(PyExc_ValueError, "elem_size %ld is outside 1..16", elem_size);
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    size_t n = (size_t)s.len / (size_t)elem_size;
    if (check_len(s.len, elem_size, "src") || check_len(d.len, elem_size, "dst")) {
    } else if (d.len && stride >= n) {
        PyErr_Format(PyExc_ValueError, "stride %llu is not below the %zu elements of src", stride, n);
    } else if (overlaps(&s, &d)) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
    } else {
        Py_BEGIN_ALLOW_THREADS
        ckz_spread_gather(s.buf, n, (size_t)elem_size, (uint64_t)stride, d.buf,
                          (size_t)d.len / (size_t)elem_size);
        Py_END_ALLOW_THREADS
        Py_INCREF(Py_None);
        result = Py_None;
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

PyDoc_STRVAR(sort_floats_doc,
             "sort_floats(x, elem_size) -> bool\n\n"
             "Sort the float32 (elem_size 4) or float64 (8) buffer x ascending in place, by a radix\n"
             "sort of their bits: numpy's order. False, x untouched, when a value is NaN.");
static PyObject *py_sort_floats(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "elem_size", NULL};
    PyObject *xo;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ol:sort_floats", kwlist, &xo, &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer x;
    if (get_buffer(xo, &x, 1, "x")) return NULL;
    PyObject *result = NULL;
    if (check_len(x.len, elem_size, "x") == 0) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = ckz_sort_floats(x.buf, (size_t)x.len / (size_t)elem_size, (size_t)elem_size);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(done == 0);
    }
    PyBuffer_Release(&x);
    return result;
}

PyDoc_STRVAR(descending_magnitudes_doc,
             "descending_magnitudes(ordered, out) -> bool\n\n"
             "The magnitudes of the ascending float64 buffer ordered, largest first, into out (as\n"
             "many float64): one merge of its negatives and the rest. False when a value is NaN.");
static PyObject *py_descending_magnitudes(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"ordered", "out", NULL};
    PyObject *oo, *outo;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:descending_magnitudes", kwlist, &oo, &outo))
        return NULL;
    Py_buffer o, out;
    if (get_buffer(oo, &o, 0, "ordered")) return NULL;
    if (get_buffer(outo, &out, 1, "out")) {
        PyBuffer_Release(&o);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(o.len, 8, "ordered") == 0) {
        if (out.len != o.len)
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, ordered %zd", out.len, o.len);
        else if (overlaps(&o, &out))
            PyErr_SetString(PyExc_ValueError, "ordered and out overlap");
        else {
            int done;
            Py_BEGIN_ALLOW_THREADS
            done = ckz_descending_magnitudes((const double *)o.buf, (size_t)o.len / 8,
                                             (double *)out.buf);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(done == 0);
        }
    }
    PyBuffer_Release(&o);
    PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(count_nonzero_doc,
             "count_nonzero(src, elem_size) -> int\n\n"
             "How many elements of src (bytes, elem_size 1; floats, 4; doubles, 8) are non-zero\n"
             "(-0.0 is zero, a NaN is not): torch.count_nonzero's count, in one pass.");

static PyObject *py_count_nonzero(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "elem_size", NULL};
    PyObject *so;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ol:count_nonzero", kwlist, &so, &elem_size))
        return NULL;
    if (elem_size != 1 && check_float_size(elem_size)) return NULL;
    Py_buffer s;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    PyObject *result = NULL;
    if (check_len(s.len, elem_size, "src") == 0) {
        size_t count;
        Py_BEGIN_ALLOW_THREADS
        count = ckz_count_nonzero(s.buf, (size_t)elem_size, (size_t)s.len / (size_t)elem_size);
        Py_END_ALLOW_THREADS
        result = PyLong_FromSize_t(count);
    }
    PyBuffer_Release(&s);
    return result;
}

PyDoc_STRVAR(floats_equal_doc,
             "floats_equal(a, b, elem_size) -> bool\n\n"
             "Whether the floats (elem_size 4) or doubles (8) a and b, of one length, are equal\n"
             "element by element as floats compare (-0.0 == 0.0, a NaN equals nothing): torch's\n"
             "(a == b).all(), without its boolean copy, stopping at the first block that differs.");

static PyObject *py_floats_equal(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"a", "b", "elem_size", NULL};
    PyObject *ao, *bo;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOl:floats_equal", kwlist, &ao, &bo, &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer a, b;
    if (get_buffer(ao, &a, 0, "a")) return NULL;
    if (get_buffer(bo, &b, 0, "b")) {
        PyBuffer_Release(&a);
        return NULL;
    }
    PyObject *result = NULL;
    if (a.len != b.len) {
        PyErr_Format(PyExc_ValueError, "a holds %zd bytes and b %zd: compare tensors of one size",
                     a.len, b.len);
    } else if (check_len(a.len, elem_size, "a") == 0) {
        int same;
        Py_BEGIN_ALLOW_THREADS
        same = ckz_floats_equal(a.buf, b.buf, (size_t)elem_size, (size_t)a.len / (size_t)elem_size);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(same == 1);
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

PyDoc_STRVAR(has_negative_doc,
             "has_negative(x, elem_size) -> bool\n\n"
             "Whether a float (elem_size 4) or double (8) of x is below zero as floats compare (-0.0\n"
             "and NaN are not): torch's (x < 0).any(), without its boolean copy, stopping at the\n"
             "first block that holds one.");

static PyObject *py_has_negative(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "elem_size", NULL};
    PyObject *xo;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Ol:has_negative", kwlist, &xo, &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer x;
    if (get_buffer(xo, &x, 0, "x")) return NULL;
    PyObject *result = NULL;
    if (check_len(x.len, elem_size, "x") == 0) {
        int negative;
        Py_BEGIN_ALLOW_THREADS
        negative = ckz_has_negative(x.buf, (size_t)elem_size, (size_t)x.len / (size_t)elem_size);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(negative == 1);
    }
    PyBuffer_Release(&x);
    return result;
}

PyDoc_STRVAR(kth_magnitude_doc,
             "kth_magnitude(src, k) -> float | None\n\n"
             "The k-th smallest (from 0) of the magnitudes of the float32 values src: torch's\n"
             "src.abs().kthvalue(k + 1), and its median() at k = (len - 1) // 2, by a radix\n"
             "selection (no copy). None where src holds a NaN; ValueError unless 0 <= k < len.");

static PyObject *py_kth_magnitude(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "k", NULL};
    PyObject *so;
    Py_ssize_t k;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On:kth_magnitude", kwlist, &so, &k)) return NULL;
    Py_buffer s;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    PyObject *result = NULL;
    if (check_len(s.len, 4, "src") == 0) {
        size_t n = (size_t)s.len / 4;
        if (k < 0 || (size_t)k >= n) {
            PyErr_Format(PyExc_ValueError, "kth_magnitude: k = %zd outside 0..%zu", k, n);
        } else {
            float value = 0.0f;
            int failed;
            Py_BEGIN_ALLOW_THREADS
            failed = ckz_kth_magnitude((const float *)s.buf, n, (size_t)k, &value);
            Py_END_ALLOW_THREADS
            if (failed) {
                result = Py_None;
                Py_INCREF(result);
            } else {
                result = PyFloat_FromDouble((double)value);
            }
        }
    }
    PyBuffer_Release(&s);
    return result;
}

PyDoc_STRVAR(compact_nonzero_doc,
             "compact_nonzero(src, dst, elem_size) -> int\n\n"
             "Copies the non-zero float32 or float64 values of src (by elem_size; -0.0 is zero, a\n"
             "NaN is not), in order, to the front of dst (as long as src), and returns how many.");
static PyObject *py_compact_nonzero(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "dst", "elem_size", NULL};
    PyObject *so, *dobj;
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOl:compact_nonzero", kwlist, &so, &dobj,
                                     &elem_size))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (check_len(s.len, elem_size, "src") == 0) {
        if (d.len != s.len)
            PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, src %zd", d.len, s.len);
        else if (overlaps(&s, &d))
            PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        else {
            size_t kept;
            Py_BEGIN_ALLOW_THREADS
            kept = ckz_compact_nonzero(s.buf, (size_t)elem_size, (size_t)s.len / (size_t)elem_size,
                                       d.buf);
            Py_END_ALLOW_THREADS
            result = PyLong_FromSize_t(kept);
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

/* Acquires count buffers (writable where asked), releasing those taken when one fails: the
 * bindings below take their arguments in one call instead of a release ladder each. */
static int get_buffers(PyObject *const objs[], Py_buffer views[], const int writable[],
                       const char *const names[], int count) {
    for (int i = 0; i < count; i++)
        if (get_buffer(objs[i], &views[i], writable[i], names[i])) {
            while (i--) PyBuffer_Release(&views[i]);
            return -1;
        }
    return 0;
}

static void release_buffers(Py_buffer views[], int count) {
    for (int i = 0; i < count; i++) PyBuffer_Release(&views[i]);
}

/* n float32 values in a buffer of `len` bytes that must match `expected` values (or any count
 * when expected is negative); -1 with a ValueError naming the buffer. */
static Py_ssize_t float32_count(Py_ssize_t len, Py_ssize_t expected, const char *name) {
    if (len % 4 || (expected >= 0 && len / 4 != expected)) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not %zd float32 values", name, len,
                     expected >= 0 ? expected : len / 4);
        return -1;
    }
    return len / 4;
}

PyDoc_STRVAR(base_ratios_doc,
             "base_ratios(x, base, dst) -> bool\n\n"
             "dst (float64) = x / base (float32 each) in float64 where x is non-zero, 0 where it\n"
             "is zero. False where a non-zero x has a base that is zero, negative or not finite\n"
             "(no ratio; dst is then meaningless).");
static PyObject *py_base_ratios(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "base", "dst", NULL};
    PyObject *objs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:base_ratios", kwlist, &objs[0], &objs[1],
                                     &objs[2]))
        return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"x", "base", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[0].len, -1, "x");
    if (n >= 0 && float32_count(v[1].len, n, "base") >= 0) {
        if (v[2].len != 8 * n)
            PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, not %zd float64 values", v[2].len, n);
        else if (overlaps(&v[0], &v[2]) || overlaps(&v[1], &v[2]))
            PyErr_SetString(PyExc_ValueError, "dst overlaps x or base");
        else {
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = ckz_base_ratios(v[0].buf, v[1].buf, (size_t)n, v[2].buf);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(status == 0);
        }
    }
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(ratio_restore_doc,
             "ratio_restore(r, elem_size, base, dst) -> None\n\n"
             "dst (float32) = base * r rounded once from float64, +0.0 where r is zero; r holds\n"
             "float32 (elem_size 4) or float64 (8) ratios, one per base value; dst may be r.");
static PyObject *py_ratio_restore(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"r", "elem_size", "base", "dst", NULL};
    PyObject *objs[3];
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OlOO:ratio_restore", kwlist, &objs[0], &elem_size,
                                     &objs[1], &objs[2]))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"r", "base", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[1].len, -1, "base");
    if (n >= 0 && float32_count(v[2].len, n, "dst") >= 0) {
        if (v[0].len != elem_size * n)
            PyErr_Format(PyExc_ValueError, "r holds %zd bytes, not %zd ratios of %ld bytes",
                         v[0].len, n, elem_size);
        else if ((overlaps(&v[0], &v[2]) && !same_memory(&v[0], &v[2])) || overlaps(&v[1], &v[2]))
            PyErr_SetString(PyExc_ValueError, "dst overlaps r (other than being it) or base");
        else {
            Py_BEGIN_ALLOW_THREADS
            ckz_ratio_restore(v[0].buf, (size_t)elem_size, v[1].buf, (size_t)n, v[2].buf);
            Py_END_ALLOW_THREADS
            result = Py_NewRef(Py_None);
        }
    }
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(step_quotients_doc,
             "step_quotients(x, scale, dst) -> bool\n\n"
             "dst (float32) = x / sqrt(scale) (float32 each) computed in float64 and rounded once\n"
             "where x is non-zero, 0 where it is zero. False where a non-zero x has a scale that\n"
             "is zero, negative or not finite (no step; dst is then meaningless).");
static PyObject *py_step_quotients(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "scale", "dst", NULL};
    PyObject *objs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:step_quotients", kwlist, &objs[0], &objs[1],
                                     &objs[2]))
        return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"x", "scale", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[0].len, -1, "x");
    if (n >= 0 && float32_count(v[1].len, n, "scale") >= 0
        && float32_count(v[2].len, n, "dst") >= 0) {
        if (overlaps(&v[0], &v[2]) || overlaps(&v[1], &v[2]))
            PyErr_SetString(PyExc_ValueError, "dst overlaps x or scale");
        else {
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = ckz_step_quotients(v[0].buf, v[1].buf, (size_t)n, v[2].buf);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(status == 0);
        }
    }
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(step_restore_doc,
             "step_restore(u, elem_size, scale, dst) -> bool\n\n"
             "dst (float32) = u * sqrt(scale) rounded once from float64, +0.0 where u is zero; u\n"
             "holds float32 (elem_size 4) or float64 (8) steps, one per scale value. False where\n"
             "a non-zero u has a scale that is negative or not finite (damage). dst may be u.");
static PyObject *py_step_restore(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"u", "elem_size", "scale", "dst", NULL};
    PyObject *objs[3];
    long elem_size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OlOO:step_restore", kwlist, &objs[0], &elem_size,
                                     &objs[1], &objs[2]))
        return NULL;
    if (check_float_size(elem_size)) return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"u", "scale", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[1].len, -1, "scale");
    if (n >= 0 && float32_count(v[2].len, n, "dst") >= 0) {
        if (v[0].len != elem_size * n)
            PyErr_Format(PyExc_ValueError, "u holds %zd bytes, not %zd steps of %ld bytes",
                         v[0].len, n, elem_size);
        else if ((overlaps(&v[0], &v[2]) && !same_memory(&v[0], &v[2])) || overlaps(&v[1], &v[2]))
            PyErr_SetString(PyExc_ValueError, "dst overlaps u (other than being it) or scale");
        else {
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = ckz_step_restore(v[0].buf, (size_t)elem_size, v[1].buf, (size_t)n, v[2].buf);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(status == 0);
        }
    }
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(sqrt_error_squares_doc,
             "sqrt_error_squares(x, y) -> float\n\n"
             "The sum over float32 x and y where x > 0 of (sqrt(y / x) - 1)^2, each term computed\n"
             "as (y - x) / (x (sqrt(y / x) + 1)) in float32, summed in float64 as sum_squares does.");
static PyObject *py_sqrt_error_squares(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "y", NULL};
    PyObject *objs[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:sqrt_error_squares", kwlist, &objs[0],
                                     &objs[1]))
        return NULL;
    Py_buffer v[2];
    static const int writable[2] = {0, 0};
    static const char *const names[2] = {"x", "y"};
    if (get_buffers(objs, v, writable, names, 2)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[0].len, -1, "x");
    if (n >= 0 && float32_count(v[1].len, n, "y") >= 0) {
        double total;
        Py_BEGIN_ALLOW_THREADS
        total = ckz_sqrt_error_squares(v[0].buf, v[1].buf, (size_t)n);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(total);
    }
    release_buffers(v, 2);
    return result;
}

PyDoc_STRVAR(residual_add_doc,
             "residual_add(base, delta, dst) -> None\n\n"
             "dst = base where delta is zero (either sign), else base + delta, all float32;\n"
             "dst may be base or delta.");
static PyObject *py_residual_add(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"base", "delta", "dst", NULL};
    PyObject *objs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:residual_add", kwlist, &objs[0], &objs[1],
                                     &objs[2]))
        return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"base", "delta", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[0].len, -1, "base");
    if (n >= 0 && float32_count(v[1].len, n, "delta") >= 0 && float32_count(v[2].len, n, "dst") >= 0) {
        Py_BEGIN_ALLOW_THREADS
        ckz_residual_add(v[0].buf, v[1].buf, (size_t)n, v[2].buf);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(keep_changed_doc,
             "keep_changed(x, mask, dst) -> None\n\n"
             "dst = x (float32) where mask marks element i (byte k, most significant bit first:\n"
             "elements 8 k .. 8 k + 7), "
             "else +0.0; mask holds (n + 7) // 8 bytes; dst may be x.");
static PyObject *py_keep_changed(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"x", "mask", "dst", NULL};
    PyObject *objs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:keep_changed", kwlist, &objs[0], &objs[1],
                                     &objs[2]))
        return NULL;
    Py_buffer v[3];
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"x", "mask", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = float32_count(v[0].len, -1, "x");
    if (n >= 0 && float32_count(v[2].len, n, "dst") >= 0) {
        if (v[1].len != (n + 7) / 8)
            PyErr_Format(PyExc_ValueError, "mask holds %zd bytes, not %zd for %zd elements",
                         v[1].len, (n + 7) / 8, n);
        else {
            Py_BEGIN_ALLOW_THREADS
            ckz_keep_changed(v[0].buf, v[1].buf, (size_t)n, v[2].buf);
            Py_END_ALLOW_THREADS
            result = Py_NewRef(Py_None);
        }
    }
    release_buffers(v, 3);
    return result;
}

/* split_planes and merge_planes share argument handling; `split` picks the direction. */
static PyObject *planes_common(PyObject *args, PyObject *kw, int split) {
    static char *kwlist[] = {"src", "dst", "elem_size", "rotate", NULL};
    PyObject *so, *dobj;
    long k, r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, split ? "OOll:split_planes" : "OOll:merge_planes",
                                     kwlist, &so, &dobj, &k, &r))
        return NULL;
    if (check_elem(k, r)) return NULL;
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) { PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    if (check_len(s.len, k, "src")) goto done;
    if (d.len != s.len) {
        PyErr_Format(PyExc_ValueError, "dst length %zd differs from src length %zd", d.len, s.len);
        goto done;
    }
    if (overlaps(&s, &d)) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        goto done;
    }
    size_t n = (size_t)s.len / (size_t)k;
    Py_BEGIN_ALLOW_THREADS
    if (split) {
        ckz_split_planes(s.buf, d.buf, n, (unsigned)k, (unsigned)r);
    } else {
        const uint8_t *planes[CKZ_MAX_ELEM_SIZE];
        for (long p = 0; p < k; p++) planes[p] = (const uint8_t *)s.buf + (size_t)p * n;
        ckz_merge_planes(planes, d.buf, n, (unsigned)k, (unsigned)r);
    }
    Py_END_ALLOW_THREADS
    ret = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    return ret;
}

PyDoc_STRVAR(split_doc, "split_planes(src, dst, elem_size, rotate) -> None\n\n"
             "Rotate each little-endian element left by `rotate` bits; byte p of element i goes "
             "to dst[p*n + i].");
static PyObject *py_split(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return planes_common(args, kw, 1);
}

PyDoc_STRVAR(merge_doc, "merge_planes(src, dst, elem_size, rotate) -> None\n\n"
             "Inverse of split_planes.");
static PyObject *py_merge(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return planes_common(args, kw, 0);
}

/* Results at least this long are copied into their bytes object without the GIL. */
#define NOGIL_COPY_BYTES (64u << 10)

/* A new bytes object holding src[0:len].  It is allocated with the GIL and filled without it:
 * nothing else can see it yet, and a large one is fresh memory whose page faults and copy, with
 * the GIL held, would serialize every coding thread (on 16 cores, encoding 1 MiB chunks went
 * 1235 -> 2505 MB/s from 1 to 8 threads). */
static PyObject *bytes_copied_nogil(const uint8_t *src, size_t len) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!out) return NULL;
    char *dst = PyBytes_AS_STRING(out);
    if (len < NOGIL_COPY_BYTES) {
        memcpy(dst, src, len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, src, len);
        Py_END_ALLOW_THREADS
    }
    return out;
}

/* encode and encode_planes: code without the GIL into this thread's scratch, then copy out the
 * exact length (a bytes object of the bound, shrunk afterwards, would be a fresh mapping per call
 * for glibc when the bound is over its mmap threshold: faults on every chunk). */
static PyObject *encode_common(Py_buffer *s, long segments, long elem_size, long rotate) {
    size_t n = (size_t)s->len;
    if ((uint64_t)n > CKZ_MAX_DECODED)
        return PyErr_Format(PyExc_ValueError, "src of %zu bytes exceeds %llu", n,
                            (unsigned long long)CKZ_MAX_DECODED);
    size_t bound = ckz_encode_bound(n, (unsigned)segments);
    uint8_t *o;
    size_t len = 0;
    int rc = 0;
    ckz_err err;
    Py_BEGIN_ALLOW_THREADS
    o = ckz_scratch_get(CKZ_SCRATCH_OUTPUT, bound);
    if (!o) rc = -1;
    else if (elem_size)
        rc = ckz_encode_planes(s->buf, n, (unsigned)elem_size, (unsigned)rotate, o, &len, &err);
    else
        len = ckz_encode(s->buf, n, (unsigned)segments, o);
    Py_END_ALLOW_THREADS
    PyObject *out = rc ? PyErr_NoMemory() : bytes_copied_nogil(o, len);
    if (o) ckz_scratch_put(CKZ_SCRATCH_OUTPUT, o);
    return out;
}

PyDoc_STRVAR(encode_doc, "encode(src, segments=1) -> bytes\n\n"
             "Entropy-code src as `segments` equal slices, each with its own table.");
static PyObject *py_encode(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "segments", NULL};
    PyObject *so;
    long segments = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|l:encode", kwlist, &so, &segments)) return NULL;
    if (segments < 1 || segments > CKZ_MAX_SEGMENTS)
        return PyErr_Format(PyExc_ValueError, "segments %ld is outside 1..%d", segments,
                            CKZ_MAX_SEGMENTS);
    Py_buffer s;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    PyObject *ret = NULL;
    if (s.len % segments)
        PyErr_Format(PyExc_ValueError, "src length %zd is not a multiple of segments %ld", s.len,
                     segments);
    else
        ret = encode_common(&s, segments, 0, 0);
    PyBuffer_Release(&s);
    return ret;
}

PyDoc_STRVAR(encode_planes_doc, "encode_planes(src, elem_size, rotate) -> bytes\n\n"
             "Same bytes as encode(split_planes(src), segments=elem_size), in one pass.");
static PyObject *py_encode_planes(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "elem_size", "rotate", NULL};
    PyObject *so;
    long k, r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oll:encode_planes", kwlist, &so, &k, &r))
        return NULL;
    if (check_elem(k, r)) return NULL;
    Py_buffer s;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    PyObject *ret = check_len(s.len, k, "src") ? NULL : encode_common(&s, k, k, r);
    PyBuffer_Release(&s);
    return ret;
}

/* decode and decode_planes: elem_size 0 selects plain decode. */
static PyObject *decode_common(PyObject *so, PyObject *dobj, long k, long r) {
    Py_buffer s, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) { PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    if (overlaps(&s, &d)) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
    } else {
        ckz_err err;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        if (k) rc = ckz_decode_planes(s.buf, (size_t)s.len, d.buf, (size_t)d.len, (unsigned)k,
                                      (unsigned)r, &err);
        else rc = ckz_decode(s.buf, (size_t)s.len, d.buf, (size_t)d.len, &err);
        Py_END_ALLOW_THREADS
        if (rc) PyErr_SetString(PyExc_ValueError, err.msg);
        else ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    return ret;
}

PyDoc_STRVAR(decode_doc, "decode(src, dst) -> None\n\n"
             "Decode a stream from encode() into dst (len(dst) == decoded_size(src)).");
static PyObject *py_decode(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "dst", NULL};
    PyObject *so, *dobj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:decode", kwlist, &so, &dobj)) return NULL;
    return decode_common(so, dobj, 0, 0);
}

PyDoc_STRVAR(decode_planes_doc, "decode_planes(src, dst, elem_size, rotate) -> None\n\n"
             "decode() then merge_planes() into dst, without the intermediate buffer.");
static PyObject *py_decode_planes(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "dst", "elem_size", "rotate", NULL};
    PyObject *so, *dobj;
    long k, r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOll:decode_planes", kwlist, &so, &dobj, &k, &r))
        return NULL;
    if (check_elem(k, r)) return NULL;
    return decode_common(so, dobj, k, r);
}

PyDoc_STRVAR(decoded_size_doc, "decoded_size(src) -> int\n\n"
             "The decoded length a stream declares, after validating its header.");
static PyObject *py_decoded_size(PyObject *self, PyObject *obj) {
    (void)self;
    Py_buffer s;
    if (get_buffer(obj, &s, 0, "src")) return NULL;
    ckz_err err;
    uint64_t n = 0;
    int rc = ckz_decoded_size(s.buf, (size_t)s.len, &n, &err);
    PyBuffer_Release(&s);
    if (rc) return PyErr_Format(PyExc_ValueError, "%s", err.msg);
    return PyLong_FromUnsignedLongLong(n);
}

/* residual_encode and residual_decode share argument handling; dst may alias src (in place), but
 * must not partly overlap either input. */
static PyObject *residual_common(PyObject *args, PyObject *kw, int encode) {
    static char *kwlist[] = {"src", "base", "dst", "width", "kind", NULL};
    PyObject *so, *bo, *dobj;
    long width, kind;
    if (!PyArg_ParseTupleAndKeywords(args, kw,
                                     encode ? "OOOll:residual_encode" : "OOOll:residual_decode",
                                     kwlist, &so, &bo, &dobj, &width, &kind))
        return NULL;
    if (width != 1 && width != 2 && width != 4 && width != 8)
        return PyErr_Format(PyExc_ValueError, "width %ld is not 1, 2, 4 or 8", width);
    if (kind < 0 || kind >= CKZ_RESIDUAL_KINDS)
        return PyErr_Format(PyExc_ValueError, "kind %ld is outside 0..%d", kind,
                            CKZ_RESIDUAL_KINDS - 1);
    Py_buffer s, b, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(bo, &b, 0, "base")) { PyBuffer_Release(&s); return NULL; }
    if (get_buffer(dobj, &d, 1, "dst")) { PyBuffer_Release(&b); PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    if (s.len != b.len || s.len != d.len) {
        PyErr_Format(PyExc_ValueError, "src, base and dst lengths differ (%zd, %zd, %zd)", s.len,
                     b.len, d.len);
    } else if (s.len % width) {
        PyErr_Format(PyExc_ValueError, "length %zd is not a multiple of width %ld", s.len, width);
    } else if ((overlaps(&s, &d) && s.buf != d.buf) || overlaps(&b, &d)) {
        PyErr_SetString(PyExc_ValueError, "dst overlaps an input (only dst is src is allowed)");
    } else {
        size_t n = (size_t)s.len / (size_t)width;
        Py_BEGIN_ALLOW_THREADS
        if (encode) ckz_residual_encode(s.buf, b.buf, d.buf, n, (unsigned)width, (unsigned)kind);
        else ckz_residual_decode(s.buf, b.buf, d.buf, n, (unsigned)width, (unsigned)kind);
        Py_END_ALLOW_THREADS
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&b);
    PyBuffer_Release(&s);
    return ret;
}

PyDoc_STRVAR(residual_encode_doc, "residual_encode(src, base, dst, width, kind) -> None\n\n"
             "dst = the exact residual of src against base (kind 0 xor, 1 float-diff, "
             "2 int-diff).");
static PyObject *py_residual_encode(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return residual_common(args, kw, 1);
}

PyDoc_STRVAR(residual_decode_doc, "residual_decode(delta, base, dst, width, kind) -> None\n\n"
             "Inverse of residual_encode; dst may be delta itself.");
static PyObject *py_residual_decode(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    return residual_common(args, kw, 0);
}

/* Context coder arguments: elem_size 1, 2, 4 or 8 and a rotation within it. */
static int check_ctx_elem(long elem_size, long rotate) {
    if (elem_size < 1 || elem_size > 8 || !ckz_ctx_elem_ok((unsigned)elem_size)) {
        PyErr_Format(PyExc_ValueError, "elem_size %ld is not 1, 2, 4 or 8", elem_size);
        return -1;
    }
    return check_elem(elem_size, rotate);
}

PyDoc_STRVAR(context_bytes_doc, "context_bytes(base, elem_size, rotate) -> bytes\n\n"
             "The top byte plane of split_planes(base, elem_size, rotate) (a float's exponent "
             "byte): the context of encode_planes_ctx.  elem_size is 1, 2, 4 or 8.");
static PyObject *py_context_bytes(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"base", "elem_size", "rotate", NULL};
    PyObject *bo;
    long k, r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oll:context_bytes", kwlist, &bo, &k, &r))
        return NULL;
    if (check_ctx_elem(k, r)) return NULL;
    Py_buffer b;
    if (get_buffer(bo, &b, 0, "base")) return NULL;
    PyObject *out = NULL;
    if (!check_len(b.len, k, "base")) {
        size_t n = (size_t)b.len / (size_t)k;
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
        if (out) {
            uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
            Py_BEGIN_ALLOW_THREADS
            ckz_context_bytes(b.buf, n, (unsigned)k, (unsigned)r, o);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&b);
    return out;
}

PyDoc_STRVAR(encode_planes_ctx_doc,
             "encode_planes_ctx(src, ctx, elem_size, rotate, format=CTX_STREAM_FORMAT) -> bytes\n\n"
             "Byte planes of src coded in buckets of the per-element context ctx (one byte per "
             "element, e.g. context_bytes(base)); decode with the same ctx.  format 4 (the "
             "default) writes format 3 for 1-byte elements and for chunks with many escapes; "
             "format 3 writes format 3.");
static PyObject *py_encode_planes_ctx(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "ctx", "elem_size", "rotate", "format", NULL};
    PyObject *so, *co;
    long k, r, format = CKZ_CTX_FORMAT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOll|l:encode_planes_ctx", kwlist, &so, &co, &k,
                                     &r, &format))
        return NULL;
    if (check_ctx_elem(k, r)) return NULL;
    if (format != CKZ_CTX_FORMAT && format != CKZ_CTX_FORMAT3) {
        PyErr_Format(PyExc_ValueError, "format %ld is not %d or %d", format, CKZ_CTX_FORMAT,
                     CKZ_CTX_FORMAT3);
        return NULL;
    }
    Py_buffer s, c;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(co, &c, 0, "ctx")) { PyBuffer_Release(&s); return NULL; }
    PyObject *out = NULL;
    size_t n = (size_t)s.len / (size_t)k;
    if (check_len(s.len, k, "src")) goto done;
    if ((size_t)c.len != n) {
        PyErr_Format(PyExc_ValueError, "ctx holds %zd bytes but src has %zu elements", c.len, n);
        goto done;
    }
    if ((uint64_t)s.len > CKZ_MAX_DECODED || (uint64_t)n > CKZ_CTX_MAX_ELEMENTS) {
        PyErr_Format(PyExc_ValueError, "src of %zd bytes (%zu elements) exceeds %llu bytes or "
                     "%llu elements: code it in chunks", s.len, n,
                     (unsigned long long)CKZ_MAX_DECODED, CKZ_CTX_MAX_ELEMENTS);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ckz_encode_ctx_bound(n, (unsigned)k));
    if (!out) goto done;
    size_t len = 0;
    int rc;
    ckz_err err;
    Py_BEGIN_ALLOW_THREADS
    rc = ckz_encode_planes_ctx(s.buf, c.buf, n, (unsigned)k, (unsigned)r, (unsigned)format,
                               (uint8_t *)PyBytes_AS_STRING(out), &len, &err);
    Py_END_ALLOW_THREADS
    if (rc) {
        Py_CLEAR(out);
        PyErr_NoMemory();
    } else if (_PyBytes_Resize(&out, (Py_ssize_t)len) < 0) {
        out = NULL;
    }
done:
    PyBuffer_Release(&c);
    PyBuffer_Release(&s);
    return out;
}

PyDoc_STRVAR(decode_planes_ctx_doc,
             "decode_planes_ctx(src, ctx, dst, elem_size, rotate) -> None\n\n"
             "Decode a stream of encode_planes_ctx into dst, given the encoder's ctx.");
static PyObject *py_decode_planes_ctx(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "ctx", "dst", "elem_size", "rotate", NULL};
    PyObject *so, *co, *dobj;
    long k, r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOll:decode_planes_ctx", kwlist, &so, &co,
                                     &dobj, &k, &r))
        return NULL;
    if (check_ctx_elem(k, r)) return NULL;
    Py_buffer s, c, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(co, &c, 0, "ctx")) { PyBuffer_Release(&s); return NULL; }
    if (get_buffer(dobj, &d, 1, "dst")) { PyBuffer_Release(&c); PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    if (overlaps(&s, &d) || overlaps(&c, &d)) {
        PyErr_SetString(PyExc_ValueError, "dst overlaps src or ctx");
    } else {
        ckz_err err;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ckz_decode_planes_ctx(s.buf, (size_t)s.len, c.buf, (size_t)c.len, d.buf,
                                   (size_t)d.len, (unsigned)k, (unsigned)r, &err);
        Py_END_ALLOW_THREADS
        if (rc) PyErr_SetString(PyExc_ValueError, err.msg);
        else ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&c);
    PyBuffer_Release(&s);
    return ret;
}

/* encode_chunk / decode_chunk argument parsing: the spec, validated. */
static int get_spec(long width, long rotate, long kind, long ctx_rotate, ckz_chunk_spec *spec) {
    ckz_err err;
    if (width < 1 || width > 8 || rotate < 0 || rotate > 63 || kind < -1 || kind > 255 ||
        ctx_rotate < -1 || ctx_rotate > 63) {
        PyErr_Format(PyExc_ValueError, "chunk spec (width %ld, rotate %ld, kind %ld, ctx_rotate "
                     "%ld) out of range", width, rotate, kind, ctx_rotate);
        return -1;
    }
    *spec = (ckz_chunk_spec){(unsigned)width, (unsigned)rotate, (int)kind, (int)ctx_rotate};
    if (ckz_chunk_spec_check(spec, &err)) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return -1;
    }
    return 0;
}

/* The base buffer a spec needs (or none: base None), checked against len. */
static int get_base(PyObject *bo, const ckz_chunk_spec *spec, Py_ssize_t len, Py_buffer *b) {
    int needs = spec->kind >= 0 || spec->ctx_rotate >= 0;
    b->buf = NULL;
    b->obj = NULL;
    if (bo == Py_None) {
        if (!needs) return 0;
        PyErr_SetString(PyExc_ValueError, "a residual or context chunk needs the base");
        return -1;
    }
    if (get_buffer(bo, b, 0, "base")) return -1;
    if (b->len != len) {
        PyErr_Format(PyExc_ValueError, "base holds %zd bytes but the chunk %zd", b->len, len);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    return 0;
}

static void release_base(Py_buffer *b) {
    if (b->obj) PyBuffer_Release(b);
}

PyDoc_STRVAR(encode_chunk_doc,
             "encode_chunk(src, base, width, rotate, kind, ctx_rotate, size_only=False) -> "
             "bytes | int\n\n"
             "One chunk of a pipeline [residual(kind)?, byteplanes(width, rotate), entropy] "
             "(ctx_rotate -1; kind -1: no residual, base None) or [residual(kind), "
             "ctxplanes(width, rotate)] with context_bytes(base, width, ctx_rotate): the same "
             "stream as the stages one by one.  size_only: its exact length, not written.");
static PyObject *py_encode_chunk(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "base", "width", "rotate", "kind", "ctx_rotate", "size_only",
                             NULL};
    PyObject *so, *bo;
    long width, rotate, kind, ctx_rotate;
    int size_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOllll|p:encode_chunk", kwlist, &so, &bo, &width,
                                     &rotate, &kind, &ctx_rotate, &size_only))
        return NULL;
    ckz_chunk_spec spec;
    if (get_spec(width, rotate, kind, ctx_rotate, &spec)) return NULL;
    Py_buffer s, b;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_base(bo, &spec, s.len, &b)) { PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    size_t len = (size_t)s.len;
    if (check_len(s.len, width, "src")) goto done;
    if (ckz_chunk_too_large(len, &spec)) {
        PyErr_Format(PyExc_ValueError, "src of %zu bytes is too large: code it in chunks", len);
        goto done;
    }
    size_t bound = ckz_chunk_bound(len, &spec), out_len = 0;
    uint8_t *o = NULL;
    int rc = 0;
    ckz_err err;
    Py_BEGIN_ALLOW_THREADS
    if (!size_only && !(o = ckz_scratch_get(CKZ_SCRATCH_OUTPUT, bound)))
        rc = ckz_fail(&err, "out of memory for %zu bytes of output", bound);
    else
        rc = ckz_chunk_encode(s.buf, b.buf, len, &spec, o, &out_len, &err);
    Py_END_ALLOW_THREADS
    if (rc) PyErr_NoMemory();
    else if (size_only) ret = PyLong_FromSize_t(out_len);
    else ret = bytes_copied_nogil(o, out_len);
    if (o) ckz_scratch_put(CKZ_SCRATCH_OUTPUT, o);
done:
    release_base(&b);
    PyBuffer_Release(&s);
    return ret;
}

PyDoc_STRVAR(decode_chunk_doc,
             "decode_chunk(src, base, dst, width, rotate, kind, ctx_rotate) -> None\n\n"
             "Decode a stream of encode_chunk (same spec and base) into dst.");
static PyObject *py_decode_chunk(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *kwlist[] = {"src", "base", "dst", "width", "rotate", "kind", "ctx_rotate", NULL};
    PyObject *so, *bo, *dobj;
    long width, rotate, kind, ctx_rotate;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOllll:decode_chunk", kwlist, &so, &bo, &dobj,
                                     &width, &rotate, &kind, &ctx_rotate))
        return NULL;
    ckz_chunk_spec spec;
    if (get_spec(width, rotate, kind, ctx_rotate, &spec)) return NULL;
    Py_buffer s, b, d;
    if (get_buffer(so, &s, 0, "src")) return NULL;
    if (get_buffer(dobj, &d, 1, "dst")) { PyBuffer_Release(&s); return NULL; }
    if (get_base(bo, &spec, d.len, &b)) { PyBuffer_Release(&d); PyBuffer_Release(&s); return NULL; }
    PyObject *ret = NULL;
    if (overlaps(&s, &d) || (b.obj && overlaps(&b, &d))) {
        PyErr_SetString(PyExc_ValueError, "dst overlaps src or base");
    } else {
        ckz_err err;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = ckz_chunk_decode(s.buf, (size_t)s.len, b.buf, d.buf, (size_t)d.len, &spec, &err);
        Py_END_ALLOW_THREADS
        if (rc) PyErr_SetString(PyExc_ValueError, err.msg);
        else ret = Py_NewRef(Py_None);
    }
    release_base(&b);
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    return ret;
}

/* encode_chunks / decode_chunks: a task's chunks in one call (chunk.h's batch loops), the GIL
 * released once for all of them.  The Python buffers each chunk holds: */
typedef struct {
    Py_buffer src, base, dst; /* base.obj NULL: none; encode: src; decode: dst */
} batch_views;

static void release_encode_views(batch_views *views, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyBuffer_Release(&views[i].src);
        release_base(&views[i].base);
    }
}

PyDoc_STRVAR(encode_chunks_doc,
             "encode_chunks(items) -> tuple[bytes, list[tuple[int, int, int]]]\n\n"
             "encode_chunk of each (src, base, width, rotate, kind, ctx_rotate) in items, in one "
             "call: the streams one after another in one bytes object, and for each its length, "
             "its CRC-32C and its src's CRC-32C.  The GIL is released once for all of them.");
static PyObject *py_encode_chunks(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "encode_chunks takes a sequence of tuples");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), parsed = 0;
    size_t slots = (size_t)(count ? count : 1);
    batch_views *views = PyMem_Calloc(slots, sizeof *views);
    ckz_chunk_item *items = PyMem_Calloc(slots, sizeof *items);
    PyObject *out = NULL, *result = NULL;
    if (!views || !items) {
        PyMem_Free(views);
        PyMem_Free(items);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    size_t bound = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *so, *bo;
        long width, rotate, kind, ctx_rotate;
        batch_views *v = &views[i];
        ckz_chunk_item *it = &items[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OOllll:encode_chunks", &so, &bo,
                              &width, &rotate, &kind, &ctx_rotate) ||
            get_spec(width, rotate, kind, ctx_rotate, &it->spec) ||
            get_buffer(so, &v->src, 0, "src"))
            goto done;
        if (get_base(bo, &it->spec, v->src.len, &v->base)) {
            PyBuffer_Release(&v->src);
            goto done;
        }
        parsed++; /* its buffers are held: released at done */
        it->raw = v->src.buf;
        it->base = v->base.buf;
        it->len = (size_t)v->src.len;
        if (check_len(v->src.len, width, "src")) goto done;
        if (ckz_chunk_too_large(it->len, &it->spec)) {
            PyErr_Format(PyExc_ValueError, "item %zd: a chunk of %zu bytes is too large: code it "
                         "in smaller chunks", i, it->len);
            goto done;
        }
        bound += ckz_chunk_bound(it->len, &it->spec);
    }
    /* allocated with the GIL, written without it: nothing else can see it yet */
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
    if (!out) goto done;
    size_t used = 0, failed = 0;
    int rc;
    ckz_err err;
    Py_BEGIN_ALLOW_THREADS
    rc = ckz_chunk_encode_batch(items, (size_t)count, (uint8_t *)PyBytes_AS_STRING(out), &used,
                                &failed, &err);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_Format(PyExc_MemoryError, "item %zd: %s", (Py_ssize_t)failed, err.msg);
        goto done;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)used) < 0) goto done; /* out is NULL then */
    PyObject *entries = PyList_New(count);
    if (!entries) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = Py_BuildValue("(nkk)", (Py_ssize_t)items[i].stream_len,
                                        (unsigned long)items[i].crc,
                                        (unsigned long)items[i].raw_crc);
        if (!entry) { Py_DECREF(entries); goto done; }
        PyList_SET_ITEM(entries, i, entry);
    }
    result = PyTuple_Pack(2, out, entries);
    Py_DECREF(entries);
done:
    Py_XDECREF(out);
    release_encode_views(views, parsed);
    PyMem_Free(views);
    PyMem_Free(items);
    Py_DECREF(seq);
    return result;
}

PyDoc_STRVAR(decode_chunks_doc,
             "decode_chunks(span, items) -> None | tuple[int, int, str]\n\n"
             "decode_chunk of each (offset, length, crc, dst, base, width, rotate, kind, "
             "ctx_rotate, raw_crc) in items, whose stream is span[offset:offset + length], in one "
             "call without the GIL.  The stream's CRC-32C is checked against crc before it is "
             "decoded, and dst's against raw_crc after.  None when every chunk passes, else "
             "(i, what, message) for the first that fails, what being 0 (the stream fails its "
             "checksum), 1 (a malformed stream: message says how) or 2 (the decoded bytes fail "
             "their checksum).");
static PyObject *py_decode_chunks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *span_obj, *arg;
    if (!PyArg_ParseTuple(args, "OO:decode_chunks", &span_obj, &arg)) return NULL;
    Py_buffer span;
    if (get_buffer(span_obj, &span, 0, "span")) return NULL;
    PyObject *seq = PySequence_Fast(arg, "decode_chunks takes a sequence of tuples");
    if (!seq) { PyBuffer_Release(&span); return NULL; }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), parsed = 0;
    size_t slots = (size_t)(count ? count : 1);
    batch_views *views = PyMem_Calloc(slots, sizeof *views);
    ckz_chunk_item *items = PyMem_Calloc(slots, sizeof *items);
    PyObject *result = NULL;
    if (!views || !items) {
        PyMem_Free(views);
        PyMem_Free(items);
        Py_DECREF(seq);
        PyBuffer_Release(&span);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *dobj, *bo;
        Py_ssize_t offset, length;
        unsigned long crc, raw_crc;
        long width, rotate, kind, ctx_rotate;
        batch_views *v = &views[i];
        ckz_chunk_item *it = &items[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "nnkOOllllk:decode_chunks",
                              &offset, &length, &crc, &dobj, &bo, &width, &rotate, &kind,
                              &ctx_rotate, &raw_crc) ||
            get_spec(width, rotate, kind, ctx_rotate, &it->spec))
            goto done;
        if (offset < 0 || length < 0 || offset > span.len || length > span.len - offset) {
            PyErr_Format(PyExc_ValueError, "item %zd: stream [%zd, +%zd) lies outside the span "
                         "of %zd bytes", i, offset, length, span.len);
            goto done;
        }
        if (crc > 0xffffffffUL || raw_crc > 0xffffffffUL) {
            PyErr_Format(PyExc_ValueError, "item %zd: a checksum exceeds 32 bits", i);
            goto done;
        }
        if (get_buffer(dobj, &v->dst, 1, "dst")) goto done;
        if (get_base(bo, &it->spec, v->dst.len, &v->base)) {
            PyBuffer_Release(&v->dst);
            goto done;
        }
        parsed++;
        /* the stream is a view into span: nothing of its own to release */
        it->stream = (const uint8_t *)span.buf + offset;
        it->stream_len = (size_t)length;
        it->crc = (uint32_t)crc;
        it->raw_crc = (uint32_t)raw_crc;
        it->dst = v->dst.buf;
        it->len = (size_t)v->dst.len;
        it->base = v->base.buf;
        if (overlaps(&span, &v->dst) || (v->base.obj && overlaps(&v->base, &v->dst))) {
            PyErr_Format(PyExc_ValueError, "item %zd: dst overlaps the span or its base", i);
            goto done;
        }
    }
    size_t failed = 0;
    int what = 0, rc;
    ckz_err err;
    err.msg[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = ckz_chunk_decode_batch(items, (size_t)count, &failed, &what, &err);
    Py_END_ALLOW_THREADS
    result = !rc ? Py_NewRef(Py_None)
                 : Py_BuildValue("(nis)", (Py_ssize_t)failed, what,
                                 what == CKZ_CHUNK_MALFORMED ? err.msg : "");
done:
    for (Py_ssize_t i = 0; i < parsed; i++) {
        release_base(&views[i].base);
        PyBuffer_Release(&views[i].dst);
    }
    PyMem_Free(views);
    PyMem_Free(items);
    Py_DECREF(seq);
    PyBuffer_Release(&span);
    return result;
}

#define KW(name, fn, doc) {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}
/* The arguments of mask_gather and mask_scatter, (src, mask, dst, elem_size): float32 or
 * float64 src and writable dst, and a uint8 mask of one byte per element of src (counted = 0)
 * or of dst (counted = 2), which dst overlaps neither. 0 with the three buffers in v and the
 * element count in *n; -1 with a Python error and no buffer held. */
static int mask_pass_args(PyObject *args, PyObject *kw, const char *format, Py_buffer v[3],
                          long *elem_size, size_t *n, int counted) {
    static char *kwlist[] = {"src", "mask", "dst", "elem_size", NULL};
    PyObject *objs[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, format, kwlist, &objs[0], &objs[1], &objs[2],
                                     elem_size))
        return -1;
    if (check_float_size(*elem_size)) return -1;
    static const int writable[3] = {0, 0, 1};
    static const char *const names[3] = {"src", "mask", "dst"};
    if (get_buffers(objs, v, writable, names, 3)) return -1;
    *n = (size_t)v[counted].len / (size_t)*elem_size;
    if (check_len(v[0].len, *elem_size, "src") || check_len(v[2].len, *elem_size, "dst")) {
    } else if ((size_t)v[1].len != *n) {
        PyErr_Format(PyExc_ValueError, "mask holds %zd bytes for %zu values", v[1].len, *n);
    } else if (overlaps(&v[0], &v[2]) || overlaps(&v[1], &v[2])) {
        PyErr_SetString(PyExc_ValueError, "dst overlaps src or mask");
    } else {
        return 0;
    }
    release_buffers(v, 3);
    return -1;
}

PyDoc_STRVAR(mask_gather_doc,
             "mask_gather(src, mask, dst, elem_size) -> int\n\n"
             "The float32 (elem_size 4) or float64 (8) values of src where the uint8 mask (one byte\n"
             "an element) is non-zero, in order, into dst; returns how many. ValueError where src\n"
             "is non-zero outside the mask, or the mask marks more than dst holds.");
static PyObject *py_mask_gather(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    Py_buffer v[3];
    long elem_size;
    size_t n;
    if (mask_pass_args(args, kw, "OOOl:mask_gather", v, &elem_size, &n, 0)) return NULL;
    long kept;
    Py_BEGIN_ALLOW_THREADS
    kept = ckz_mask_gather(v[0].buf, v[1].buf, (size_t)elem_size, n, v[2].buf,
                           (size_t)v[2].len / (size_t)elem_size);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (kept == -1)
        PyErr_SetString(PyExc_ValueError, "src is non-zero outside the mask");
    else if (kept == -2)
        PyErr_Format(PyExc_ValueError, "the mask marks more than the %zd values dst holds",
                     v[2].len / elem_size);
    else
        result = PyLong_FromLong(kept);
    release_buffers(v, 3);
    return result;
}

PyDoc_STRVAR(mask_scatter_doc,
             "mask_scatter(src, mask, dst, elem_size) -> bool\n\n"
             "dst[i] = the k-th value of src at the k-th element the uint8 mask marks, +0.0\n"
             "elsewhere (float32, elem_size 4, or float64, 8). False where the mask does not mark\n"
             "exactly len(src) elements (dst is then meaningless).");
static PyObject *py_mask_scatter(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    Py_buffer v[3];
    long elem_size;
    size_t n;
    if (mask_pass_args(args, kw, "OOOl:mask_scatter", v, &elem_size, &n, 2)) return NULL;
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = ckz_mask_scatter(v[0].buf, (size_t)v[0].len / (size_t)elem_size, v[1].buf,
                            (size_t)elem_size, n, v[2].buf);
    Py_END_ALLOW_THREADS
    release_buffers(v, 3);
    return PyBool_FromLong(done == 0);
}

static PyMethodDef methods[] = {
    KW("crc32c", py_crc32c, crc32c_doc),
    KW("bytes_equal", py_bytes_equal, bytes_equal_doc),
    KW("byte_histogram", py_byte_histogram, byte_histogram_doc),
    KW("dither_offsets", py_dither_offsets, dither_offsets_doc),
    KW("dither_shift", py_dither_shift, dither_shift_doc),
    KW("round_levels", py_round_levels, round_levels_doc),
    KW("nearest_codes", py_nearest_codes, nearest_codes_doc),
    KW("uniform_bins", py_uniform_bins, uniform_bins_doc),
    KW("sum_squares", py_sum_squares, sum_squares_doc),
    KW("rounding_spread", py_rounding_spread, rounding_spread_doc),
    KW("level_bits", py_level_bits, level_bits_doc),
    KW("lloyd_sorted", py_lloyd_sorted, lloyd_sorted_doc),
    KW("uniform_candidate", py_uniform_candidate, uniform_candidate_doc),
    KW("quantize_search", py_quantize_search, quantize_search_doc),
    KW("step_bisect", py_step_bisect, step_bisect_doc),
    KW("table_lookup", py_table_lookup, table_lookup_doc),
    KW("compact_nonzero", py_compact_nonzero, compact_nonzero_doc),
    KW("count_nonzero", py_count_nonzero, count_nonzero_doc),
    KW("floats_equal", py_floats_equal, floats_equal_doc),
    KW("has_negative", py_has_negative, has_negative_doc),
    KW("kth_magnitude", py_kth_magnitude, kth_magnitude_doc),
    KW("sort_floats", py_sort_floats, sort_floats_doc),
    KW("spread_gather", py_spread_gather, spread_gather_doc),
    KW("mask_gather", py_mask_gather, mask_gather_doc),
    KW("mask_scatter", py_mask_scatter, mask_scatter_doc),
    KW("descending_magnitudes", py_descending_magnitudes, descending_magnitudes_doc),
    KW("base_ratios", py_base_ratios, base_ratios_doc),
    KW("ratio_restore", py_ratio_restore, ratio_restore_doc),
    KW("step_quotients", py_step_quotients, step_quotients_doc),
    KW("step_restore", py_step_restore, step_restore_doc),
    KW("sqrt_error_squares", py_sqrt_error_squares, sqrt_error_squares_doc),
    KW("residual_add", py_residual_add, residual_add_doc),
    KW("keep_changed", py_keep_changed, keep_changed_doc),
    KW("sparse_survey", py_sparse_survey, sparse_survey_doc),
    KW("writeback", py_writeback, writeback_doc),
    KW("sparse_pack", py_sparse_pack, sparse_pack_doc),
    KW("sparse_unpack", py_sparse_unpack, sparse_unpack_doc),
    KW("split_planes", py_split, split_doc),
    KW("merge_planes", py_merge, merge_doc),
    KW("encode", py_encode, encode_doc),
    KW("decode", py_decode, decode_doc),
    KW("encode_planes", py_encode_planes, encode_planes_doc),
    KW("decode_planes", py_decode_planes, decode_planes_doc),
    KW("residual_encode", py_residual_encode, residual_encode_doc),
    KW("residual_decode", py_residual_decode, residual_decode_doc),
    KW("context_bytes", py_context_bytes, context_bytes_doc),
    KW("encode_planes_ctx", py_encode_planes_ctx, encode_planes_ctx_doc),
    KW("decode_planes_ctx", py_decode_planes_ctx, decode_planes_ctx_doc),
    KW("encode_chunk", py_encode_chunk, encode_chunk_doc),
    KW("decode_chunk", py_decode_chunk, decode_chunk_doc),
    {"encode_chunks", py_encode_chunks, METH_O, encode_chunks_doc},
    {"decode_chunks", py_decode_chunks, METH_VARARGS, decode_chunks_doc},
    {"decoded_size", py_decoded_size, METH_O, decoded_size_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "ckptzip._native",
    "ckptzip's native core: byte planes, the entropy coder, CRC-32C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    ckz_init();
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "MAX_ELEM_SIZE", CKZ_MAX_ELEM_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_FORMAT", CKZ_STREAM_FORMAT) < 0 ||
        PyModule_AddIntConstant(m, "CTX_STREAM_FORMAT", CKZ_CTX_FORMAT) < 0 ||
        PyModule_AddIntConstant(m, "RANS_SMALL_LIMIT", CKZ_RANS_SMALL_LIMIT) < 0 ||
        ckz_add_memory_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
