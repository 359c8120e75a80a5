/* torch_renaissance.trace._pickle_scan: the safe unpickler's structure scan at C speed.
 *
 * The same walk as the pure-Python check_pickle_structure in
 * torch_renaissance/trace/safe_pickle.py (whose docstring states what is checked and why),
 * opcode for opcode: the two must accept and refuse the same files, and
 * tests/test_trace_pickle_scan.py runs both on the same generated pickles. The Python one is
 * the reference and the fallback when this module is not built.
 *
 * Invariants of this file:
 *  - It reads the buffer only, builds no Python object from it except the short text
 *    argument lines of protocol 0 (handed to the Python helper `text_arg`) and the error
 *    tuple, and never calls anything the file names.
 *  - Every read is bounds-checked against the buffer's length before it happens.
 *  - Memory is linear in the buffer's length: the stack is capped at max_stack items, memo
 *    indices are below the length, one byte per container for depth and one for "inside".
 *  - Only the CPython C API is used (no torch, no C++).
 *
 * scan(data, limit, max_stack, text_arg) returns None when the pickle may be unpickled, or
 * a tuple (message, refused, position) when it must not: refused is True for files that are
 * well-formed but not allowed (nesting, keys, opcodes, cycles), False for corrupt ones;
 * position is the byte offset of the opcode at fault (the caller adds it to the message).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PRIMITIVE (-1)
#define UNSAFE_KEY (-2)
#define UNSET (-3)

typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Vec;

static int vec_reserve(Vec *a, Py_ssize_t need) {
    if (need <= a->cap) return 0;
    Py_ssize_t cap = a->cap ? a->cap : 64;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(int64_t)) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    int64_t *v = (int64_t *)PyMem_Realloc(a->v, (size_t)cap * sizeof(int64_t));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    a->v = v;
    a->cap = cap;
    return 0;
}

static inline int vec_push(Vec *a, int64_t x) {
    if (a->n == a->cap && vec_reserve(a, a->n + 1) < 0) return -1;
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    uint8_t *v;
    Py_ssize_t n, cap;
} Bytes;

static inline int bytes_push(Bytes *a, uint8_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 256;
        uint8_t *v = (uint8_t *)PyMem_Realloc(a->v, (size_t)cap);
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

typedef struct {
    const uint8_t *p;
    Py_ssize_t size;
    int limit;
    Py_ssize_t max_stack;
    PyObject *text_arg;
    Vec objs, marks, memo;
    Bytes odepth, inside;
    Py_ssize_t memo_count;
    /* the failure, when there is one */
    PyObject *message;
    int refused;
} Scan;

/* Records a failure (message built like PyUnicode_FromFormat); returns -1. */
static int fail(Scan *s, int refused, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    s->message = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    s->refused = refused;
    return -1;
}

static inline Py_ssize_t fence(const Scan *s) { return s->marks.n ? (Py_ssize_t)s->marks.v[s->marks.n - 1] : 0; }

static int deeper(Scan *s, int d) {
    if (d > s->limit)
        return fail(s, 1,
                    "refusing to load: the pickle nests containers %d levels deep, more than the "
                    "%d allowed (memory snapshots nest fewer than 20)",
                    d, s->limit);
    return 0;
}

static int check_keys(Scan *s, Py_ssize_t start, int stride, const char *name) {
    for (Py_ssize_t i = start; i < s->objs.n; i += stride)
        if (s->objs.v[i] != PRIMITIVE)
            return fail(s, 1,
                        "refusing to load: %s makes a %s of a float, a container or an integer "
                        "outside [-2**63, 2**64); such keys can share one hash by the thousand and "
                        "make loading take quadratic time (memory snapshots key their dicts by "
                        "strings)",
                        name, stride == 1 ? "set element" : "dict key");
    return 0;
}

/* Pops the stack items from start into a container; the depth they give it (0 for no
 * items, 1 for primitives only). */
static int take(Scan *s, Py_ssize_t start) {
    int d = s->objs.n > start ? 1 : 0;
    for (Py_ssize_t i = start; i < s->objs.n; i++) {
        int64_t o = s->objs.v[i];
        if (o >= 0) {
            s->inside.v[o] = 1;
            if (s->odepth.v[o] >= d) d = s->odepth.v[o] + 1;
        }
    }
    s->objs.n = start;
    return d;
}

static int new_container(Scan *s, int d) {
    if (deeper(s, d) < 0) return -1;
    if (vec_push(&s->objs, s->odepth.n) < 0 || bytes_push(&s->odepth, (uint8_t)d) < 0 ||
        bytes_push(&s->inside, 0) < 0)
        return -2;
    return 0;
}

static int fill(Scan *s, Py_ssize_t target, int d, const char *name) {
    int64_t o = s->objs.v[target];
    if (o < 0) {
        if (d > 1) return fail(s, 0, "%s puts containers into a string or number", name);
        return 0;
    }
    if (d > 1 && s->inside.v[o])
        return fail(s, 1,
                    "refusing to load: %s fills a container that is already inside another one "
                    "(a cycle, or a chain built to nest deeper than the limit; pickle never "
                    "writes that for plain data)",
                    name);
    if (d > s->odepth.v[o]) {
        if (deeper(s, d) < 0) return -1;
        s->odepth.v[o] = (uint8_t)d;
    }
    return 0;
}

static int fill_from_mark(Scan *s, const char *name, int stride) {
    if (!s->marks.n) return fail(s, 0, "%s without a MARK", name);
    Py_ssize_t k = (Py_ssize_t)s->marks.v[--s->marks.n];
    if (stride && check_keys(s, k, stride, name) < 0) return -1;
    if (s->objs.n > k) {
        if (k == 0) return fail(s, 0, "stack underflow at %s", name);
        return fill(s, k - 1, take(s, k), name);
    }
    return 0;
}

static int memo_put(Scan *s, int64_t idx, const char *name) {
    if (s->objs.n <= fence(s)) return fail(s, 0, "stack underflow at %s", name);
    if (idx < 0 || idx >= s->size)
        return fail(s, 0, "%s of memo index %lld, out of range", name, (long long)idx);
    if (idx >= s->memo.n) {
        if (vec_reserve(&s->memo, idx + 1) < 0) return -2;
        for (Py_ssize_t i = s->memo.n; i <= idx; i++) s->memo.v[i] = UNSET;
        s->memo.n = idx + 1;
    }
    if (s->memo.v[idx] == UNSET) s->memo_count++;
    s->memo.v[idx] = s->objs.v[s->objs.n - 1];
    return 0;
}

static int memo_get(Scan *s, int64_t idx, const char *name) {
    int64_t v = (idx >= 0 && idx < s->memo.n) ? s->memo.v[idx] : UNSET;
    if (v == UNSET) return fail(s, 0, "%s of memo index %lld, which is not set", name, (long long)idx);
    return vec_push(&s->objs, v) < 0 ? -2 : 0;
}

static inline uint64_t le(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

/* PRIMITIVE when the little-endian two's-complement integer of n bytes is in
 * [-2**63, 2**64), else UNSAFE_KEY. */
static int64_t long_key(const uint8_t *p, Py_ssize_t n) {
    if (n <= 8) return PRIMITIVE;
    int negative = (p[n - 1] & 0x80) != 0;
    for (Py_ssize_t i = 8; i < n; i++)
        if (p[i] != (negative ? 0xFF : 0x00)) return UNSAFE_KEY;
    if (negative && !(p[7] & 0x80)) return UNSAFE_KEY; /* below -2**63 */
    return PRIMITIVE;
}

/* The Python helper's answer for a text line: -1 with an exception set on error. */
static int text_arg(Scan *s, const char *name, const uint8_t *line, Py_ssize_t n, int64_t *out) {
    PyObject *r = PyObject_CallFunction(s->text_arg, "sy#", name, (const char *)line, n);
    if (!r) return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

enum { TRUNCATED = -10 };

static int walk(Scan *s, Py_ssize_t *at) {
    const uint8_t *p = s->p;
    const Py_ssize_t size = s->size;
    Py_ssize_t pos = 0;
    int r;
    for (;;) {
        *at = pos;
        if (pos >= size) return TRUNCATED;
        const uint8_t op = p[pos++];
        Py_ssize_t avail = size - pos;
        switch (op) {
        /* pushes of a primitive with a fixed-size argument */
        case 'N': case 0x88: case 0x89: /* NONE NEWTRUE NEWFALSE */
            r = vec_push(&s->objs, PRIMITIVE) < 0 ? -2 : 0;
            break;
        case 'K': case 'M': case 'J': case 'G': { /* BININT1 BININT2 BININT BINFLOAT */
            const int width = op == 'K' ? 1 : op == 'M' ? 2 : op == 'J' ? 4 : 8;
            if (avail < width) return TRUNCATED;
            pos += width;
            r = vec_push(&s->objs, op == 'G' ? UNSAFE_KEY : PRIMITIVE) < 0 ? -2 : 0;
            break;
        }
        /* data after a length */
        case 0x8c: case 'U': case 'C': case 0x8a: /* SHORT_BINUNICODE SHORT_BINSTRING
                                                      SHORT_BINBYTES LONG1 */
        case 'X': case 'B': case 'T': case 0x8b:   /* BINUNICODE BINBYTES BINSTRING LONG4 */
        case 0x8d: case 0x8e: case 0x96: {         /* BINUNICODE8 BINBYTES8 BYTEARRAY8 */
            int width = (op == 0x8c || op == 'U' || op == 'C' || op == 0x8a) ? 1
                        : (op == 0x8d || op == 0x8e || op == 0x96)           ? 8
                                                                             : 4;
            if (avail < width) return TRUNCATED;
            uint64_t n = le(p + pos, width);
            if ((op == 'T' || op == 0x8b) && (n & 0x80000000u)) {
                const char *name = op == 'T' ? "BINSTRING" : "LONG4";
                return fail(s, 0, "%s with a negative length (%lld)", name,
                            (long long)(int32_t)(uint32_t)n);
            }
            pos += width;
            if (n > (uint64_t)(size - pos)) return TRUNCATED;
            int64_t kind = (op == 0x8a || op == 0x8b) ? long_key(p + pos, (Py_ssize_t)n) : PRIMITIVE;
            pos += (Py_ssize_t)n;
            r = vec_push(&s->objs, kind) < 0 ? -2 : 0;
            break;
        }
        /* text lines (protocol 0) */
        case 'I': case 'L': case 'F': case 'S': case 'V': case 'g': case 'p': {
            const uint8_t *nl = (const uint8_t *)memchr(p + pos, '\n', (size_t)avail);
            if (!nl) return TRUNCATED;
            Py_ssize_t n = nl - (p + pos);
            const uint8_t *line = p + pos;
            pos += n + 1;
            if (op == 'S' || op == 'V') {
                r = vec_push(&s->objs, PRIMITIVE) < 0 ? -2 : 0;
            } else if (op == 'F') {
                r = vec_push(&s->objs, UNSAFE_KEY) < 0 ? -2 : 0;
            } else {
                const char *name = op == 'I' ? "INT" : op == 'L' ? "LONG" : op == 'g' ? "GET" : "PUT";
                int64_t v; /* INT, LONG: PRIMITIVE or UNSAFE_KEY; GET, PUT: the index or -1 */
                if (text_arg(s, name, line, n, &v) < 0) return -2;
                if (op == 'g') {
                    r = memo_get(s, v, name);
                } else if (op == 'p') {
                    r = memo_put(s, v, name);
                    if (r) return r;
                    continue;
                } else {
                    r = vec_push(&s->objs, v) < 0 ? -2 : 0;
                }
            }
            break;
        }
        case 'h': /* BINGET */
            if (avail < 1) return TRUNCATED;
            r = memo_get(s, p[pos], "BINGET");
            pos += 1;
            break;
        case 'j': /* LONG_BINGET */
            if (avail < 4) return TRUNCATED;
            r = memo_get(s, (int64_t)le(p + pos, 4), "LONG_BINGET");
            pos += 4;
            break;
        case 'q': /* BINPUT */
            if (avail < 1) return TRUNCATED;
            if ((r = memo_put(s, p[pos], "BINPUT"))) return r;
            pos += 1;
            continue;
        case 'r': /* LONG_BINPUT */
            if (avail < 4) return TRUNCATED;
            if ((r = memo_put(s, (int64_t)le(p + pos, 4), "LONG_BINPUT"))) return r;
            pos += 4;
            continue;
        case 0x94: /* MEMOIZE */
            if ((r = memo_put(s, s->memo_count, "MEMOIZE"))) return r;
            continue;
        case '(': /* MARK: each open MARK is a container being built */
            if (deeper(s, (int)Py_MIN(s->marks.n + 1, (Py_ssize_t)s->limit + 1)) < 0) return -1;
            if (vec_push(&s->marks, s->objs.n) < 0) return -2;
            continue;
        case '}': case ']': case ')': case 0x8f: /* EMPTY_DICT EMPTY_LIST EMPTY_TUPLE EMPTY_SET */
            r = new_container(s, 1);
            break;
        case 'u': case 'e': case 0x90: /* SETITEMS APPENDS ADDITEMS */
            if ((r = fill_from_mark(s, op == 'u' ? "SETITEMS" : op == 'e' ? "APPENDS" : "ADDITEMS",
                                    op == 'u' ? 2 : op == 0x90 ? 1 : 0)))
                return r;
            continue;
        case 't': case 'l': case 'd': case 0x91: { /* TUPLE LIST DICT FROZENSET */
            const char *name = op == 't' ? "TUPLE" : op == 'l' ? "LIST" : op == 'd' ? "DICT" : "FROZENSET";
            if (!s->marks.n) return fail(s, 0, "%s without a MARK", name);
            Py_ssize_t k = (Py_ssize_t)s->marks.v[--s->marks.n];
            if ((op == 'd' || op == 0x91) && check_keys(s, k, op == 'd' ? 2 : 1, name) < 0) return -1;
            int d = take(s, k);
            r = new_container(s, d > 1 ? d : 1);
            break; /* an empty MARK gives one item more: the stack cap below applies */
        }
        case 'a': case 's': { /* APPEND SETITEM */
            const char *name = op == 'a' ? "APPEND" : "SETITEM";
            Py_ssize_t x = s->objs.n - (op == 'a' ? 1 : 2); /* the container is at x - 1 */
            if (x < 1 || x < fence(s)) return fail(s, 0, "stack underflow at %s", name);
            if (op == 's' && check_keys(s, x, 2, name) < 0) return -1;
            if ((r = fill(s, x - 1, take(s, x), name))) return r;
            continue;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1 TUPLE2 TUPLE3 */
            const char *name = op == 0x85 ? "TUPLE1" : op == 0x86 ? "TUPLE2" : "TUPLE3";
            Py_ssize_t x = s->objs.n - (op - 0x84);
            if (x < fence(s)) return fail(s, 0, "stack underflow at %s", name);
            if ((r = new_container(s, take(s, x)))) return r;
            continue;
        }
        case '2': /* DUP */
            if (s->objs.n <= fence(s)) return fail(s, 0, "stack underflow at DUP");
            if (s->objs.v[s->objs.n - 1] >= 0)
                return fail(s, 1,
                            "refusing to load: DUP of a container (pickle never writes DUP; two "
                            "stack copies of one container could hide its depth)");
            r = vec_push(&s->objs, s->objs.v[s->objs.n - 1]) < 0 ? -2 : 0;
            break;
        case '0': /* POP */
            if (s->marks.n && s->marks.v[s->marks.n - 1] == s->objs.n)
                s->marks.n--;
            else if (s->objs.n > fence(s))
                s->objs.n--;
            else
                return fail(s, 0, "stack underflow at POP");
            continue;
        case '1': /* POP_MARK */
            if (!s->marks.n) return fail(s, 0, "POP_MARK without a MARK");
            s->objs.n = (Py_ssize_t)s->marks.v[--s->marks.n];
            continue;
        case 0x80: /* PROTO */
            if (avail < 1) return TRUNCATED;
            pos += 1;
            continue;
        case 0x95: /* FRAME */
            if (avail < 8) return TRUNCATED;
            pos += 8;
            continue;
        case '.': /* STOP */
            if (s->objs.n <= fence(s)) return fail(s, 0, "stack underflow at STOP");
            return 0;
        case 'c': case 0x93: case 'i': case 'P': case 'Q': /* GLOBAL STACK_GLOBAL INST PERSID BINPERSID */
            return 0; /* SafeUnpickler refuses this opcode before building anything after it */
        case 'R': case 'b': case 'o': case 0x81: case 0x92: case 0x82: case 0x83: case 0x84:
        case 0x97: case 0x98: {
            /* EXT1/2/4 read their argument first (as the Python scan does): truncated first */
            if (avail < (op == 0x82 ? 1 : op == 0x83 ? 2 : op == 0x84 ? 4 : 0)) return TRUNCATED;
            const char *name = op == 'R' ? "REDUCE" : op == 'b' ? "BUILD" : op == 'o' ? "OBJ"
                             : op == 0x81 ? "NEWOBJ" : op == 0x92 ? "NEWOBJ_EX" : op == 0x82 ? "EXT1"
                             : op == 0x83 ? "EXT2" : op == 0x84 ? "EXT4" : op == 0x97 ? "NEXT_BUFFER"
                             : "READONLY_BUFFER";
            return fail(s, 1,
                        "refusing to load: the pickle uses the opcode %s, which plain data "
                        "(dicts, lists, strings, numbers) never needs",
                        name);
        }
        default:
            return fail(s, 0, "unknown opcode (byte %u)", (unsigned)op);
        }
        if (r) return r;
        if (s->objs.n > s->max_stack) /* after a push */
            return fail(s, 1,
                        "refusing to load: the pickle keeps more than %zd items on the unpickling "
                        "stack",
                        s->max_stack);
    }
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int limit;
    Py_ssize_t max_stack;
    PyObject *text;
    if (!PyArg_ParseTuple(args, "y*inO:scan", &view, &limit, &max_stack, &text)) return NULL;
    if (limit < 0 || limit > 254) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "limit must be in [0, 254]");
        return NULL;
    }
    Scan s;
    memset(&s, 0, sizeof s);
    s.p = (const uint8_t *)view.buf;
    s.size = view.len;
    s.limit = limit;
    s.max_stack = max_stack;
    s.text_arg = text;
    PyObject *result = NULL;
    Py_ssize_t at = 0;
    /* BINGET indices need no growth: 256 entries from the start */
    if (vec_reserve(&s.memo, 256) == 0) {
        for (int i = 0; i < 256; i++) s.memo.v[i] = UNSET;
        s.memo.n = 256;
        int r = walk(&s, &at);
        if (r == TRUNCATED) {
            result = Py_BuildValue("(NOn)",
                                   PyUnicode_FromFormat("pickle data was truncated: %zd bytes",
                                                        s.size),
                                   Py_False, at);
        } else if (r == -1 && s.message) {
            result = Py_BuildValue("(NOn)", s.message, s.refused ? Py_True : Py_False, at);
            s.message = NULL;
        } else if (r == 0) {
            result = Py_NewRef(Py_None);
        } /* else an exception is set (MemoryError, or from text_arg) */
    }
    Py_XDECREF(s.message);
    PyMem_Free(s.objs.v);
    PyMem_Free(s.marks.v);
    PyMem_Free(s.memo.v);
    PyMem_Free(s.odepth.v);
    PyMem_Free(s.inside.v);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, limit, max_stack, text_arg) -> None or (message, refused, position)\n\n"
     "The structure scan of torch_renaissance.trace.safe_pickle.check_pickle_structure."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pickle_scan",
    "The safe unpickler's structure scan at C speed (see torch_renaissance.trace.safe_pickle).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pickle_scan(void) { return PyModule_Create(&module); }
