/* pymemory.c - the Python types over memory.c: PageBuffer (decoded tensors' memory) and
 * Assembler (a dumps() result built in place).  Both exist to spare page faults (memory.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "memory.h"
#include "pymemory.h"

/* ---- PageBuffer: a writable byte buffer on huge-page-advised anonymous memory -------------- */

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t size;
} PageBuffer;

/* Mappings of freed PageBuffers, kept for a later PageBuffer of the same size: memory already
 * faulted in, as glibc keeps freed heap blocks (without it, loading the same checkpoint twice
 * zeroes and faults in every page twice).  At most CACHE_SLOTS mappings and CACHE_BYTES in
 * all; the GIL guards it (PageBuffers are made and freed with the GIL held). */
#define CACHE_SLOTS 256
#define CACHE_BYTES ((size_t)256 << 20)
static struct {
    void *data;
    size_t size;
} cache[CACHE_SLOTS];
static unsigned cached;
static size_t cached_bytes;

static void *cache_take(size_t size) {
    for (unsigned i = 0; i < cached; i++)
        if (cache[i].size == size) {
            void *data = cache[i].data;
            cache[i] = cache[--cached];
            cached_bytes -= size;
            return data;
        }
    return NULL;
}

static int cache_keep(void *data, size_t size) {
    if (cached == CACHE_SLOTS || size > CACHE_BYTES - cached_bytes) return 0;
    cache[cached].data = data;
    cache[cached++].size = size;
    cached_bytes += size;
    return 1;
}

static PyObject *page_buffer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n:PageBuffer", kwlist, &size)) return NULL;
    if (size < 0) return PyErr_Format(PyExc_ValueError, "size %zd is negative", size);
    PageBuffer *self = (PageBuffer *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    void *data = cache_take(size ? (size_t)size : 1);
    if (!data) {
        Py_BEGIN_ALLOW_THREADS /* munmap of the trimmed head and tail, madvise */
        data = ckz_pages_alloc(size ? (size_t)size : 1);
        Py_END_ALLOW_THREADS
    }
    if (!data) {
        Py_DECREF(self);
        return PyErr_Format(PyExc_MemoryError, "cannot map %zd bytes", size);
    }
    self->data = data;
    self->size = size;
    return (PyObject *)self;
}

static void page_buffer_dealloc(PageBuffer *self) {
    size_t size = self->size ? (size_t)self->size : 1;
    if (self->data && !cache_keep(self->data, size)) ckz_pages_free(self->data, size);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Views hold a reference to the PageBuffer (PyBuffer_FillInfo), so it outlives them. */
static int page_buffer_getbuffer(PageBuffer *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static Py_ssize_t page_buffer_len(PageBuffer *self) { return self->size; }

static PyBufferProcs page_buffer_as_buffer = {(getbufferproc)page_buffer_getbuffer, NULL};
static PySequenceMethods page_buffer_as_sequence = {.sq_length = (lenfunc)page_buffer_len};

PyDoc_STRVAR(page_buffer_doc,
             "PageBuffer(size)\n\n"
             "size writable bytes, uninitialized, on an anonymous mapping that starts on a 2 MiB "
             "boundary, with transparent huge pages advised for its whole 2 MiB pages: writing "
             "it the first time faults once per 2 MiB instead of once per 4 KiB.  The mappings "
             "of freed PageBuffers (up to 256 MiB) serve later ones of the same size.  A buffer: "
             "wrap it with memoryview, numpy.frombuffer or torch.frombuffer, which keep it "
             "alive.");

static PyTypeObject PageBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ckptzip._native.PageBuffer",
    .tp_basicsize = sizeof(PageBuffer),
    .tp_dealloc = (destructor)page_buffer_dealloc,
    .tp_as_sequence = &page_buffer_as_sequence,
    .tp_as_buffer = &page_buffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = page_buffer_doc,
    .tp_new = page_buffer_new,
};

/* ---- Assembler: head + appended parts as one bytes object, built in place ------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *bytes; /* the result being built: only this object refers to it until finish */
    size_t capacity; /* allocated length of bytes */
    size_t reserve;  /* where the data starts while appending */
    size_t position; /* bytes of data appended */
    size_t writers;  /* write_at copies running without the GIL: the buffer must not move */
} Assembler;

/* Grows the bytes object to hold at least `need` bytes (amortized doubling). */
static int assembler_grow(Assembler *self, size_t need) {
    if (need <= self->capacity) return 0;
    size_t capacity = self->capacity * 2 > need ? self->capacity * 2 : need;
    if (capacity > (size_t)PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the assembled bytes would exceed PY_SSIZE_T_MAX");
        return -1;
    }
    if (_PyBytes_Resize(&self->bytes, (Py_ssize_t)capacity) < 0) return -1;
    ckz_advise_huge(PyBytes_AS_STRING(self->bytes), capacity);
    self->capacity = capacity;
    return 0;
}

static PyObject *assembler_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"reserve", "capacity", NULL};
    Py_ssize_t reserve, capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nn:Assembler", kwlist, &reserve, &capacity))
        return NULL;
    if (reserve < 0 || capacity < 0)
        return PyErr_Format(PyExc_ValueError, "reserve %zd and capacity %zd must be >= 0",
                            reserve, capacity);
    Assembler *self = (Assembler *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    size_t want = (size_t)reserve + (size_t)capacity;
    self->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)want);
    if (!self->bytes) { /* a capacity hint too large to map: start small and grow */
        PyErr_Clear();
        want = (size_t)reserve + ((size_t)capacity < ((size_t)64 << 20) ? (size_t)capacity
                                                                         : ((size_t)64 << 20));
        self->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)want);
        if (!self->bytes) {
            Py_DECREF(self);
            return NULL;
        }
    }
    ckz_advise_huge(PyBytes_AS_STRING(self->bytes), want);
    self->capacity = want;
    self->reserve = (size_t)reserve;
    return (PyObject *)self;
}

static void assembler_dealloc(Assembler *self) {
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int assembler_open(Assembler *self) {
    if (self->bytes) return 0;
    PyErr_SetString(PyExc_ValueError, "the Assembler is finished");
    return -1;
}

PyDoc_STRVAR(assembler_append_doc, "append(data) -> None\n\nCopies data after what came before.");
/* The buffer moves only under the GIL with no write_at copy running. */
static int assembler_still(Assembler *self) {
    if (!self->writers) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the Assembler's buffer would move while write_at() "
                    "copies run: wait for them first");
    return -1;
}

static PyObject *assembler_append(Assembler *self, PyObject *obj) {
    if (assembler_open(self) || assembler_still(self)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    size_t len = (size_t)view.len, at = self->reserve + self->position;
    if (assembler_grow(self, at + len)) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(self->bytes) + at;
    if (len >= ((size_t)64 << 10)) { /* let the coding threads run during a long copy */
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, view.buf, len);
        Py_END_ALLOW_THREADS
    } else {
        memcpy(dst, view.buf, len);
    }
    self->position += len;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(assembler_claim_doc,
             "claim(n) -> int\n\n"
             "Sets the next n bytes of data aside (growing the buffer if needed) and returns the\n"
             "offset write_at takes for them.  Only while no write_at runs: growing moves the\n"
             "buffer.");
static PyObject *assembler_claim(Assembler *self, PyObject *arg) {
    if (assembler_open(self)) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "claim of %zd bytes: must be >= 0", n);
        return NULL;
    }
    size_t at = self->reserve + self->position;
    if ((size_t)n > (size_t)PY_SSIZE_T_MAX - at) {
        PyErr_SetString(PyExc_OverflowError, "the assembled bytes would exceed PY_SSIZE_T_MAX");
        return NULL;
    }
    if (at + (size_t)n > self->capacity && assembler_still(self)) return NULL; /* it would grow */
    if (assembler_grow(self, at + (size_t)n)) return NULL;
    self->position += (size_t)n;
    return PyLong_FromSize_t(at);
}

PyDoc_STRVAR(assembler_write_at_doc,
             "write_at(offset, data) -> None\n\n"
             "Copies data to a claimed offset, without the GIL: threads may fill claimed regions\n"
             "at once.  The region must lie within what claim() set aside.");
static PyObject *assembler_write_at(Assembler *self, PyObject *args) {
    Py_ssize_t offset;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "nO:write_at", &offset, &obj)) return NULL;
    if (assembler_open(self)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    size_t len = (size_t)view.len, end = self->reserve + self->position;
    if (offset < (Py_ssize_t)self->reserve || (size_t)offset > end || len > end - (size_t)offset) {
        PyErr_Format(PyExc_ValueError, "write_at(%zd, %zu bytes) outside the claimed data "
                     "[%zu, %zu)", offset, len, self->reserve, end);
        PyBuffer_Release(&view);
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(self->bytes) + offset;
    self->writers++; /* under the GIL, as every reader of it */
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst, view.buf, len);
    Py_END_ALLOW_THREADS
    self->writers--;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(assembler_finish_doc,
             "finish(head) -> bytes\n\n"
             "head followed by everything appended, as one bytes object (the data is moved "
             "once, in place, when head is not `reserve` bytes long).  The Assembler is empty "
             "afterwards.");
static PyObject *assembler_finish(Assembler *self, PyObject *obj) {
    if (assembler_open(self) || assembler_still(self)) return NULL;
    Py_buffer head;
    if (PyObject_GetBuffer(obj, &head, PyBUF_SIMPLE) < 0) return NULL;
    size_t h = (size_t)head.len, total = h + self->position;
    if (assembler_grow(self, total)) { /* a head longer than the reserve */
        PyBuffer_Release(&head);
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(self->bytes);
    if (h != self->reserve) {
        Py_BEGIN_ALLOW_THREADS
        memmove(buf + h, buf + self->reserve, self->position);
        Py_END_ALLOW_THREADS
    }
    memcpy(buf, head.buf, h);
    PyBuffer_Release(&head);
    PyObject *result = self->bytes;
    self->bytes = NULL;
    if (_PyBytes_Resize(&result, (Py_ssize_t)total) < 0) return NULL;
    return result;
}

static PyObject *assembler_get_position(Assembler *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->position);
}

static PyObject *assembler_get_room(Assembler *self, void *closure) {
    (void)closure;
    size_t used = self->reserve + self->position;
    return PyLong_FromSize_t(self->bytes && self->capacity > used ? self->capacity - used : 0);
}

static PyMethodDef assembler_methods[] = {
    {"append", (PyCFunction)assembler_append, METH_O, assembler_append_doc},
    {"claim", (PyCFunction)assembler_claim, METH_O, assembler_claim_doc},
    {"write_at", (PyCFunction)assembler_write_at, METH_VARARGS, assembler_write_at_doc},
    {"finish", (PyCFunction)assembler_finish, METH_O, assembler_finish_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef assembler_getset[] = {
    {"position", (getter)assembler_get_position, NULL, "bytes of data appended so far", NULL},
    {"room", (getter)assembler_get_room, NULL,
     "bytes that claim() or append() can take before the buffer grows (moves)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(assembler_doc,
             "Assembler(reserve, capacity)\n\n"
             "Builds `head + data` as one bytes object without a final join: the data is "
             "appended behind `reserve` bytes kept for the head, in memory sized for `capacity` "
             "bytes of data up front (a hint; it grows as needed) with huge pages advised.");

static PyTypeObject AssemblerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ckptzip._native.Assembler",
    .tp_basicsize = sizeof(Assembler),
    .tp_dealloc = (destructor)assembler_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = assembler_doc,
    .tp_methods = assembler_methods,
    .tp_getset = assembler_getset,
    .tp_new = assembler_new,
};

int ckz_add_memory_types(PyObject *module) {
    if (PyType_Ready(&PageBufferType) < 0 || PyType_Ready(&AssemblerType) < 0) return -1;
    Py_INCREF(&PageBufferType);
    if (PyModule_AddObject(module, "PageBuffer", (PyObject *)&PageBufferType) < 0) {
        Py_DECREF(&PageBufferType);
        return -1;
    }
    Py_INCREF(&AssemblerType);
    if (PyModule_AddObject(module, "Assembler", (PyObject *)&AssemblerType) < 0) {
        Py_DECREF(&AssemblerType);
        return -1;
    }
    return 0;
}
