/*
 * tokenmeter._native: the CPython extension behind tokenmeter.Client.
 *
 * The hot calls (tokens, tokens_batch, arrived, queued, scheduled,
 * preempted, finished, step, expert_load) are methods of the base type
 * _native.Client, written against the C API with METH_FASTCALL: a call
 * reads its arguments without building a tuple, and one call into
 * libtokenmeter (linked statically into this module) appends the event.
 *
 * Every method has one fast path, for arguments of the exact types an
 * engine passes (int or str ids, ints in range, buffers of native integers)
 * and otherwise calls the Python subclass's slow method of the same name
 * with "_slow" appended (tokenmeter/_native_client.py): it checks the
 * arguments as the ctypes binding does, raises with the same messages, or
 * converts them to those exact types and calls the fast path again. So the
 * rules and their messages live in one place (tokenmeter/_common.py), and
 * this file only decides "fast or not".
 *
 * The GIL is held through every event call (each is a few stores into the
 * calling thread's buffer); close and flush, which wait, release it. The
 * handle is read and used under the GIL, so a close() in another thread
 * cannot free it in between; closed, the methods pass NULL, which the
 * library answers with TM_E_INVALID, as the ctypes binding does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "tokenmeter/tokenmeter.h"

/* ---- arguments ----------------------------------------------------------
 */

/* A request id as the library takes it: s == NULL for an integer id. */
typedef struct {
  uint64_t v;
  const char* s;
  Py_ssize_t len;
} Rid;

/* An exact int 0 .. 2^64-1, into *out; 0 on success, -1 when the value
 * takes the slow path (no exception left set). */
static int U64Of(PyObject* o, uint64_t* out) {
  if (!PyLong_CheckExact(o)) return -1;
#if PY_VERSION_HEX < 0x030C0000
  /* CPython 3.11's layout: the sign in ob_size, 30-bit digits. Most ids
   * and counts are one or two digits; this saves the generic call. */
  {
    Py_ssize_t size = Py_SIZE(o);
    const digit* d = ((PyLongObject*)o)->ob_digit;
    if (size == 0) {
      *out = 0;
      return 0;
    }
    if (size == 1) {
      *out = d[0];
      return 0;
    }
    if (size == 2) {
      *out = (uint64_t)d[0] | ((uint64_t)d[1] << PyLong_SHIFT);
      return 0;
    }
    if (size < 0) return -1;
  }
#endif
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  *out = v;
  return 0;
}

static int U32Of(PyObject* o, uint64_t lo, uint32_t* out) {
  uint64_t v;
  if (U64Of(o, &v) != 0 || v < lo || v > UINT32_MAX) return -1;
  *out = (uint32_t)v;
  return 0;
}

/* An exact str (1 .. TM_MAX_RID_BYTES bytes of UTF-8), exact bytes (the
 * same length) or exact int id. */
static int RidOf(PyObject* o, Rid* r) {
  if (PyUnicode_CheckExact(o)) {
    r->s = PyUnicode_AsUTF8AndSize(o, &r->len);
    if (r->s == NULL) {
      PyErr_Clear(); /* a lone surrogate: the slow path raises */
      return -1;
    }
  } else if (PyBytes_CheckExact(o)) {
    r->s = PyBytes_AS_STRING(o);
    r->len = PyBytes_GET_SIZE(o);
  } else {
    r->s = NULL;
    return U64Of(o, &r->v);
  }
  return r->len >= 1 && r->len <= (Py_ssize_t)TM_MAX_RID_BYTES ? 0 : -1;
}

/* t_ns: absent (0, now) or an exact int 0 .. 2^64-1. */
static int TimeOf(PyObject* o, uint64_t* t) {
  if (o == NULL) {
    *t = 0;
    return 0;
  }
  return U64Of(o, t);
}

/* Binds a vectorcall's arguments to `n` parameters named `names`
 * (interned), the first `npos` of them positional-or-keyword, the rest
 * keyword-only. Absent ones stay NULL. -1 for anything else (too many,
 * an unknown or repeated keyword): the slow path binds those and raises
 * as Python would. */
static int Bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                PyObject* const* names, int n, int npos, PyObject** out) {
  for (int i = 0; i < n; ++i) out[i] = NULL;
  if (nargs > npos) return -1;
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  if (kwnames == NULL) return 0;
  Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int i = 0;
    while (i < n && names[i] != key) ++i;
    if (i == n) { /* a key built at run time: compare the text */
      i = 0;
      while (i < n && PyUnicode_Compare(names[i], key) != 0) ++i;
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (i == n || out[i] != NULL) return -1;
    out[i] = args[nargs + k];
  }
  return 0;
}

/* ---- the slow path -------------------------------------------------------
 */

/* self.<name>(*args, **kwargs) with the call's own arguments. */
static PyObject* Slow(PyObject* self, PyObject* name, PyObject* const* args,
                      size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  PyObject* small[16];
  PyObject** v = small;
  if (total + 1 > (Py_ssize_t)(sizeof small / sizeof small[0])) {
    v = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject*));
    if (v == NULL) return PyErr_NoMemory();
  }
  v[0] = self;
  for (Py_ssize_t i = 0; i < total; ++i) v[i + 1] = args[i];
  PyObject* r =
      PyObject_VectorcallMethod(name, v, (size_t)(nargs + 1), kwnames);
  if (v != small) PyMem_Free(v);
  return r;
}

/* Interned names: parameters and slow methods. */
static PyObject* s_rid;
static PyObject* s_n;
static PyObject* s_t_ns;
static PyObject* s_rids;
static PyObject* s_prompt_tokens;
static PyObject* s_max_tokens;
static PyObject* s_lora;
static PyObject* s_labels;
static PyObject* s_reason;
static PyObject* s_layer;
static PyObject* s_counts;
static PyObject* s_step_keys[TM_STEP_KEY_COUNT];
static PyObject* s_spec_accepted_per_pos;
static PyObject* s_tokens_slow;
static PyObject* s_tokens_batch_slow;
static PyObject* s_tokens_batch_diagnose;
static PyObject* s_arrived_slow;
static PyObject* s_queued_slow;
static PyObject* s_scheduled_slow;
static PyObject* s_preempted_slow;
static PyObject* s_finished_slow;
static PyObject* s_step_slow;
static PyObject* s_expert_load_slow;
/* Protocol 1.2. */
static PyObject* s_priority;
static PyObject* s_traceparent;
static PyObject* s_tracestate;
static PyObject* s_cached_tokens;
static PyObject* s_external_tokens;
static PyObject* s_role;
static PyObject* s_start_ns;
static PyObject* s_bytes;
static PyObject* s_blocks;
static PyObject* s_ok;
static PyObject* s_connector;
static PyObject* s_scheduler;
static PyObject* s_weights;
static PyObject* s_kv_cache;
static PyObject* s_admission_rejected_slow;
static PyObject* s_kv_transfer_slow;
static PyObject* s_sleep_state_slow;
static PyObject* s_arrived_refused;
static PyObject* s_label_value_refused;
static PyObject* s_kv_transfer_refused;
static PyObject* s_reason_name; /* "reason", as _label_value_refused's what */
static PyObject* s_value_name;  /* "value", register_value()'s */
/* Protocol 1.3. */
static PyObject* s_generation_tokens;
static PyObject* s_summary_fields[11]; /* tm_request_summary_info's order */
static PyObject* s_ttft_ns;
static PyObject* s_itl_ns;
static PyObject* s_preemptions;
static PyObject* s_request_summary_slow;
static PyObject* s_latencies_slow;
static PyObject* s_stop;
static PyObject* s_length;
static PyObject* s_abort;
static PyObject* s_error;

static const char* const kStepKeyNames[TM_STEP_KEY_COUNT] = {
    "running",           "waiting",
    "kv_usage",          "prompt_tokens",
    "generation_tokens", "prefix_queries",
    "prefix_hits",       "spec_drafts",
    "spec_draft_tokens", "spec_accepted_tokens",
    "waiting_deferred"};

static int InternAll(void) {
  struct {
    PyObject** slot;
    const char* text;
  } table[] = {
      {&s_rid, "rid"},
      {&s_n, "n"},
      {&s_t_ns, "t_ns"},
      {&s_rids, "rids"},
      {&s_prompt_tokens, "prompt_tokens"},
      {&s_max_tokens, "max_tokens"},
      {&s_lora, "lora"},
      {&s_labels, "labels"},
      {&s_reason, "reason"},
      {&s_layer, "layer"},
      {&s_counts, "counts"},
      {&s_spec_accepted_per_pos, "spec_accepted_per_pos"},
      {&s_tokens_slow, "_tokens_slow"},
      {&s_tokens_batch_slow, "_tokens_batch_slow"},
      {&s_tokens_batch_diagnose, "_tokens_batch_diagnose"},
      {&s_arrived_slow, "_arrived_slow"},
      {&s_queued_slow, "_queued_slow"},
      {&s_scheduled_slow, "_scheduled_slow"},
      {&s_preempted_slow, "_preempted_slow"},
      {&s_finished_slow, "_finished_slow"},
      {&s_step_slow, "_step_slow"},
      {&s_expert_load_slow, "_expert_load_slow"},
      {&s_priority, "priority"},
      {&s_traceparent, "traceparent"},
      {&s_tracestate, "tracestate"},
      {&s_cached_tokens, "cached_tokens"},
      {&s_external_tokens, "external_tokens"},
      {&s_role, "role"},
      {&s_start_ns, "start_ns"},
      {&s_bytes, "bytes"},
      {&s_blocks, "blocks"},
      {&s_ok, "ok"},
      {&s_connector, "connector"},
      {&s_scheduler, "scheduler"},
      {&s_weights, "weights"},
      {&s_kv_cache, "kv_cache"},
      {&s_admission_rejected_slow, "_admission_rejected_slow"},
      {&s_kv_transfer_slow, "_kv_transfer_slow"},
      {&s_sleep_state_slow, "_sleep_state_slow"},
      {&s_arrived_refused, "_arrived_refused"},
      {&s_label_value_refused, "_label_value_refused"},
      {&s_kv_transfer_refused, "_kv_transfer_refused"},
      {&s_reason_name, "reason"},
      {&s_value_name, "value"},
      {&s_stop, "stop"},
      {&s_length, "length"},
      {&s_abort, "abort"},
      {&s_error, "error"},
      {&s_generation_tokens, "generation_tokens"},
      {&s_summary_fields[0], "cached_tokens"},
      {&s_summary_fields[1], "max_tokens"},
      {&s_summary_fields[2], "n"},
      {&s_summary_fields[3], "max_generation_tokens"},
      {&s_summary_fields[4], "ttft_ns"},
      {&s_summary_fields[5], "queue_ns"},
      {&s_summary_fields[6], "prefill_ns"},
      {&s_summary_fields[7], "decode_ns"},
      {&s_summary_fields[8], "inference_ns"},
      {&s_summary_fields[9], "e2e_ns"},
      {&s_summary_fields[10], "tpot_ns"},
      {&s_ttft_ns, "ttft_ns"},
      {&s_itl_ns, "itl_ns"},
      {&s_preemptions, "preemptions"},
      {&s_request_summary_slow, "_request_summary_slow"},
      {&s_latencies_slow, "_latencies_slow"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
    *table[i].slot = PyUnicode_InternFromString(table[i].text);
    if (*table[i].slot == NULL) return -1;
  }
  for (int i = 0; i < TM_STEP_KEY_COUNT; ++i) {
    s_step_keys[i] = PyUnicode_InternFromString(kStepKeyNames[i]);
    if (s_step_keys[i] == NULL) return -1;
  }
  return 0;
}

/* ---- buffers of integers -------------------------------------------------
 */

/* How a buffer's items read as integers: its struct format, one native
 * integer code with an optional '@', '=' or '<' (little-endian hosts).
 * Returns the item size and sets *is_signed, or 0 for any other format. */
static Py_ssize_t IntFormat(const char* f, int* is_signed) {
  if (f == NULL) f = "B";
  if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN)) ++f;
  if (f[0] == '\0' || f[1] != '\0') return 0;
  *is_signed = f[0] >= 'a' && f[0] <= 'z';
  switch (f[0]) {
    case 'b':
    case 'B':
      return 1;
    case 'h':
    case 'H':
      return 2;
    case 'i':
    case 'I':
      return 4;
    case 'l':
    case 'L':
      return (Py_ssize_t)sizeof(long);
    case 'q':
    case 'Q':
    case 'n':
    case 'N':
      return 8;
    default:
      return 0;
  }
}

/* A one-dimensional buffer's step: exporters such as ctypes arrays leave
 * strides (and shape) NULL when the items are contiguous. */
static Py_ssize_t Stride(const Py_buffer* b) {
  return b->strides != NULL ? b->strides[0] : b->itemsize;
}

/* Item i of a one-dimensional integer buffer, as read by its format. 0 on
 * success, -1 when it is negative. */
static int ReadItem(const Py_buffer* b, Py_ssize_t i, Py_ssize_t size,
                    int is_signed, uint64_t* out) {
  const char* p = (const char*)b->buf + i * Stride(b);
  int64_t s = 0;
  uint64_t u = 0;
#define TM_READ(bits)        \
  if (is_signed) {           \
    int##bits##_t x;         \
    memcpy(&x, p, sizeof x); \
    s = x;                   \
  } else {                   \
    uint##bits##_t x;        \
    memcpy(&x, p, sizeof x); \
    u = x;                   \
  }
  switch (size) {
    case 1:
      TM_READ(8)
      break;
    case 2:
      TM_READ(16)
      break;
    case 4:
      TM_READ(32)
      break;
    default:
      TM_READ(64)
      break;
  }
#undef TM_READ
  if (is_signed) {
    if (s < 0) return -1;
    u = (uint64_t)s;
  }
  *out = u;
  return 0;
}

/* Integers, owned or borrowed: either `p` points into the caller's buffer
 * (no copy), or into `mem` (PyMem) or `local`. */
typedef struct {
  const void* p;
  Py_ssize_t n;
  void* mem;
  uint64_t local[512]; /* 4 KiB: a step of 512 ids needs no allocation */
} Ints;

static void IntsFree(Ints* v) {
  if (v->mem != NULL) PyMem_Free(v->mem);
  v->mem = NULL;
}

static void* IntsSpace(Ints* v, Py_ssize_t n, size_t item) {
  if ((size_t)n * item <= sizeof v->local) return v->local;
  v->mem = PyMem_Malloc((size_t)n * item + 1);
  if (v->mem == NULL) PyErr_NoMemory();
  return v->mem;
}

/* out[i] = x, out an array of `width`-byte (8 or 4) integers. */
static void Put(void* out, size_t width, Py_ssize_t i, uint64_t x) {
  if (width == 8) {
    ((uint64_t*)out)[i] = x;
  } else {
    ((uint32_t*)out)[i] = (uint32_t)x;
  }
}

/* Outcome of reading integers: taken, refused with an exception set (a
 * buffer of the wrong kind: say so clearly), or not ours (the slow path
 * converts or raises). */
enum { kTaken = 0, kRaised = -1, kSlow = -2 };

/* n integers into v's own space as `width`-byte ints, each read from
 * items[i] (exact ints) or else from item i of `view` (`size` bytes,
 * `is_signed`); kSlow when one is not an int 0 .. max. */
static int CopyInts(PyObject** items, const Py_buffer* view, Py_ssize_t n,
                    Py_ssize_t size, int is_signed, size_t width, uint64_t max,
                    Ints* v) {
  void* out = IntsSpace(v, n, width);
  if (out == NULL) return kRaised;
  for (Py_ssize_t i = 0; i < n; ++i) {
    uint64_t x;
    int bad = items != NULL ? U64Of(items[i], &x)
                            : ReadItem(view, i, size, is_signed, &x);
    if (bad != 0 || x > max) {
      IntsFree(v);
      return kSlow;
    }
    Put(out, width, i, x);
  }
  v->p = out;
  v->n = n;
  return kTaken;
}

/* `o`'s items as `width`-byte (8 or 4) unsigned integers, each at most
 * `max`. A list or tuple of exact ints is converted here; a buffer of
 * native integers is used in place when it already is `width` bytes,
 * unsigned (or signed, none negative), contiguous and aligned, else read
 * item by item; `raw_bytes` reads a buffer of bytes (format B, b or c) as
 * native uint64s, its length a multiple of 8. A buffer of another format
 * (floats, structs, more than one dimension) is refused with TypeError;
 * `what` names the argument. A value out of range, or anything else, is
 * kSlow. The buffer (*view, released by the caller when view->obj) stays
 * exported while the integers are used. */
static int IntsOf(PyObject* o, size_t width, uint64_t max, int raw_bytes,
                  const char* what, Py_buffer* view, Ints* v) {
  view->obj = NULL;
  v->mem = NULL;
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    return CopyInts(PySequence_Fast_ITEMS(o), NULL, n, 0, 0, width, max, v);
  }
  if (PyUnicode_Check(o) || !PyObject_CheckBuffer(o)) return kSlow;
  if (PyObject_GetBuffer(o, view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    view->obj = NULL;
    return kSlow;
  }
  int is_signed = 0;
  Py_ssize_t size = IntFormat(view->format, &is_signed);
  if (size == 0 || view->ndim != 1 || view->itemsize != size) {
    PyErr_Format(PyExc_TypeError,
                 "%s: a buffer of format '%s', itemsize %zd, %d dimension(s):"
                 " it must be one-dimensional with integer items (in place "
                 "when they are native %s-bit unsigned ints: array('%s'), "
                 "numpy.%s)",
                 what, view->format ? view->format : "B", view->itemsize,
                 view->ndim, width == 8 ? "64" : "32", width == 8 ? "Q" : "I",
                 width == 8 ? "uint64" : "uint32");
    return kRaised;
  }
  Py_ssize_t n = view->shape != NULL ? view->shape[0] : view->len / size;
  if (raw_bytes && size == 1) {
    if (view->len % 8 != 0 || Stride(view) != 1) {
      PyErr_Format(PyExc_ValueError,
                   "%s given as bytes: %zd bytes is not a whole number of "
                   "uint64s",
                   what, view->len);
      return kRaised;
    }
    size = 8;
    is_signed = 0;
    n = view->len / 8;
    if (((uintptr_t)view->buf & 7u) == 0) {
      const uint64_t* p = view->buf;
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (p[i] > max) return kSlow;
      }
      v->p = p;
      v->n = n;
      return kTaken;
    }
    uint64_t* out = IntsSpace(v, n, 8);
    if (out == NULL) return kRaised;
    memcpy(out, view->buf, (size_t)n * 8);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (out[i] > max) {
        IntsFree(v);
        return kSlow;
      }
    }
    v->p = out;
    v->n = n;
    return kTaken;
  }
  if ((size_t)size == width && Stride(view) == size &&
      ((uintptr_t)view->buf % width) == 0) {
    /* In place: one pass checks the range (and the sign). */
    int ok = 1;
    if (width == 8) {
      const uint64_t* p = view->buf;
      uint64_t bad = 0;
      if (is_signed) {
        for (Py_ssize_t i = 0; i < n; ++i) bad |= p[i];
        ok = (bad >> 63) == 0;
      }
      if (ok && max != UINT64_MAX) {
        for (Py_ssize_t i = 0; i < n; ++i) ok &= p[i] <= max;
      }
    } else if (is_signed) {
      const uint32_t* p = view->buf;
      uint32_t bad = 0;
      for (Py_ssize_t i = 0; i < n; ++i) bad |= p[i];
      ok = (bad >> 31) == 0;
    }
    if (!ok) return kSlow;
    v->p = view->buf;
    v->n = n;
    return kTaken;
  }
  return CopyInts(NULL, view, n, size, is_signed, width, max, v);
}

static void ViewRelease(Py_buffer* view) {
  if (view->obj != NULL) PyBuffer_Release(view);
}

/* ---- Options -------------------------------------------------------------
 */

typedef struct {
  PyObject_HEAD tm_options* o;
} OptionsObject;

static PyObject* Options_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  (void)args;
  (void)kw;
  OptionsObject* self = (OptionsObject*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->o = tm_options_new();
  if (self->o == NULL) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return (PyObject*)self;
}

static void Options_dealloc(OptionsObject* self) {
  tm_options_free(self->o);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

#define TM_STR_SETTER(name)                                           \
  static PyObject* Options_##name(OptionsObject* self, PyObject* a) { \
    const char* s = PyBytes_AsString(a);                              \
    if (s == NULL) return NULL;                                       \
    return PyLong_FromLong(tm_options_##name(self->o, s));            \
  }
TM_STR_SETTER(set_socket_path)
TM_STR_SETTER(set_engine)
TM_STR_SETTER(set_model)
TM_STR_SETTER(set_instance)
TM_STR_SETTER(set_scope)
TM_STR_SETTER(set_profile)
#undef TM_STR_SETTER

/* Two bytes arguments. */
static int TwoBytes(PyObject* const* args, Py_ssize_t nargs, const char** a,
                    PyObject** second) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "two arguments expected");
    return -1;
  }
  *a = PyBytes_AsString(args[0]);
  *second = args[1];
  return *a == NULL ? -1 : 0;
}

/* A setter of two strings (bytes without NUL). */
static PyObject* TwoStrSetter(OptionsObject* self, PyObject* const* args,
                              Py_ssize_t nargs,
                              int (*set)(tm_options*, const char*,
                                         const char*)) {
  const char* first;
  PyObject* v;
  if (TwoBytes(args, nargs, &first, &v) != 0) return NULL;
  const char* second = PyBytes_AsString(v);
  if (second == NULL) return NULL;
  return PyLong_FromLong(set(self->o, first, second));
}

static PyObject* Options_add_label(OptionsObject* self, PyObject* const* args,
                                   Py_ssize_t nargs) {
  return TwoStrSetter(self, args, nargs, tm_options_add_label);
}

static PyObject* Options_add_cache_config_str(OptionsObject* self,
                                              PyObject* const* args,
                                              Py_ssize_t nargs) {
  return TwoStrSetter(self, args, nargs, tm_options_add_cache_config_str);
}

static PyObject* Options_add_cache_config_int(OptionsObject* self,
                                              PyObject* const* args,
                                              Py_ssize_t nargs) {
  const char* key;
  PyObject* v;
  if (TwoBytes(args, nargs, &key, &v) != 0) return NULL;
  long long value = PyLong_AsLongLong(v);
  if (value == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(tm_options_add_cache_config_int(self->o, key, value));
}

static PyObject* Options_add_cache_config_float(OptionsObject* self,
                                                PyObject* const* args,
                                                Py_ssize_t nargs) {
  const char* key;
  PyObject* v;
  if (TwoBytes(args, nargs, &key, &v) != 0) return NULL;
  double value = PyFloat_AsDouble(v);
  if (value == -1.0 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(
      tm_options_add_cache_config_float(self->o, key, value));
}

static PyObject* Options_add_cache_config_bool(OptionsObject* self,
                                               PyObject* const* args,
                                               Py_ssize_t nargs) {
  const char* key;
  PyObject* v;
  if (TwoBytes(args, nargs, &key, &v) != 0) return NULL;
  int value = PyObject_IsTrue(v);
  if (value < 0) return NULL;
  return PyLong_FromLong(tm_options_add_cache_config_bool(self->o, key, value));
}

/* An int argument in lo .. hi (the binding checked the rules before). */
static int IntArg(PyObject* a, long long lo, long long hi, long long* out) {
  *out = PyLong_AsLongLong(a);
  if (*out == -1 && PyErr_Occurred()) return -1;
  if (*out < lo || *out > hi) {
    PyErr_SetString(PyExc_OverflowError, "value out of range");
    return -1;
  }
  return 0;
}

static PyObject* Options_set_max_lora(OptionsObject* self, PyObject* a) {
  long long v;
  if (IntArg(a, 0, INT64_MAX, &v) != 0) return NULL;
  return PyLong_FromLong(tm_options_set_max_lora(self->o, v));
}

#define TM_SIZE_SETTER(name)                                          \
  static PyObject* Options_##name(OptionsObject* self, PyObject* a) { \
    long long v;                                                      \
    if (IntArg(a, 0, INT64_MAX, &v) != 0) return NULL;                \
    return PyLong_FromLong(tm_options_##name(self->o, (size_t)v));    \
  }
TM_SIZE_SETTER(set_buffer_capacity)
TM_SIZE_SETTER(set_replay_bytes)
#undef TM_SIZE_SETTER

static PyObject* Options_set_ack(OptionsObject* self, PyObject* a) {
  long long v;
  if (IntArg(a, 0, 1, &v) != 0) return NULL;
  return PyLong_FromLong(tm_options_set_ack(self->o, (int)v));
}

#define TM_U32_SETTER(name)                                           \
  static PyObject* Options_##name(OptionsObject* self, PyObject* a) { \
    long long v;                                                      \
    if (IntArg(a, 0, UINT32_MAX, &v) != 0) return NULL;               \
    return PyLong_FromLong(tm_options_##name(self->o, (uint32_t)v));  \
  }
TM_U32_SETTER(set_flush_interval_ms)
TM_U32_SETTER(set_close_timeout_ms)
TM_U32_SETTER(set_max_threads)
#undef TM_U32_SETTER

static PyMethodDef Options_methods[] = {
    {"set_socket_path", (PyCFunction)Options_set_socket_path, METH_O, NULL},
    {"set_engine", (PyCFunction)Options_set_engine, METH_O, NULL},
    {"set_model", (PyCFunction)Options_set_model, METH_O, NULL},
    {"set_instance", (PyCFunction)Options_set_instance, METH_O, NULL},
    {"set_scope", (PyCFunction)Options_set_scope, METH_O, NULL},
    {"set_profile", (PyCFunction)Options_set_profile, METH_O, NULL},
    {"add_label", (PyCFunction)(void (*)(void))Options_add_label, METH_FASTCALL,
     NULL},
    {"add_cache_config_str",
     (PyCFunction)(void (*)(void))Options_add_cache_config_str, METH_FASTCALL,
     NULL},
    {"add_cache_config_int",
     (PyCFunction)(void (*)(void))Options_add_cache_config_int, METH_FASTCALL,
     NULL},
    {"add_cache_config_float",
     (PyCFunction)(void (*)(void))Options_add_cache_config_float, METH_FASTCALL,
     NULL},
    {"add_cache_config_bool",
     (PyCFunction)(void (*)(void))Options_add_cache_config_bool, METH_FASTCALL,
     NULL},
    {"set_max_lora", (PyCFunction)Options_set_max_lora, METH_O, NULL},
    {"set_buffer_capacity", (PyCFunction)Options_set_buffer_capacity, METH_O,
     NULL},
    {"set_flush_interval_ms", (PyCFunction)Options_set_flush_interval_ms,
     METH_O, NULL},
    {"set_close_timeout_ms", (PyCFunction)Options_set_close_timeout_ms, METH_O,
     NULL},
    {"set_max_threads", (PyCFunction)Options_set_max_threads, METH_O, NULL},
    {"set_ack", (PyCFunction)Options_set_ack, METH_O, NULL},
    {"set_replay_bytes", (PyCFunction)Options_set_replay_bytes, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OptionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tokenmeter._native.Options",
    .tp_basicsize = sizeof(OptionsObject),
    .tp_dealloc = (destructor)Options_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "tm_options: each setter takes bytes or ints the binding has "
        "checked and returns the library's status code.",
    .tp_methods = Options_methods,
    .tp_new = Options_new,
};

/* ---- Client --------------------------------------------------------------
 */

typedef struct {
  PyObject_HEAD tm_client* h; /* NULL: not opened, closed or forked away */
  PyObject* weakrefs;
} ClientObject;

static void Client_dealloc(ClientObject* self) {
  /* The handle is closed by the subclass's weakref.finalize (at collection
   * or at exit), which holds the handle, not the object. */
  if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject*)self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* StatsTuple(const uint64_t* s) {
  PyObject* t = PyTuple_New(TM_STAT_COUNT);
  if (t == NULL) return NULL;
  for (int i = 0; i < TM_STAT_COUNT; ++i) {
    PyObject* v = PyLong_FromUnsignedLongLong(s[i]);
    if (v == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

/* _open(options) -> status: creates the client (tm_client_new). */
static PyObject* Client_open(ClientObject* self, PyObject* opts) {
  if (!PyObject_TypeCheck(opts, &OptionsType)) {
    PyErr_SetString(PyExc_TypeError, "_open takes an Options");
    return NULL;
  }
  if (self->h != NULL) {
    PyErr_SetString(PyExc_RuntimeError, "client already open");
    return NULL;
  }
  tm_client* h = NULL;
  int rc = tm_client_new(((OptionsObject*)opts)->o, &h);
  if (rc == TM_OK) self->h = h;
  return PyLong_FromLong(rc);
}

/* _handle() -> int: the handle's address, for the finalizer (0: none). */
static PyObject* Client_handle(ClientObject* self, PyObject* unused) {
  (void)unused;
  return PyLong_FromVoidPtr(self->h);
}

/* _close() -> (status, stats tuple), or None when already closed. */
static PyObject* Client_close(ClientObject* self, PyObject* unused) {
  (void)unused;
  tm_client* h = self->h;
  if (h == NULL) Py_RETURN_NONE;
  self->h = NULL; /* later calls (any thread) pass NULL: TM_E_INVALID */
  uint64_t s[TM_STAT_COUNT] = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = tm_client_close(h, s, TM_STAT_COUNT);
  Py_END_ALLOW_THREADS PyObject* stats = StatsTuple(s);
  if (stats == NULL) return NULL;
  return Py_BuildValue("(iN)", rc, stats);
}

/* _forget(): drops the handle without closing it (a fork()'s child). */
static PyObject* Client_forget(ClientObject* self, PyObject* unused) {
  (void)unused;
  self->h = NULL;
  Py_RETURN_NONE;
}

/* _stats() -> stats tuple, or None when closed. */
static PyObject* Client_stats(ClientObject* self, PyObject* unused) {
  (void)unused;
  uint64_t s[TM_STAT_COUNT];
  if (self->h == NULL || tm_client_stats(self->h, s, TM_STAT_COUNT) != TM_OK)
    Py_RETURN_NONE;
  return StatsTuple(s);
}

/* _flush(ms) -> status (the GIL released meanwhile), None when closed. The
 * subclass holds its close lock around it, so the handle outlives it. */
static PyObject* Client_flush(ClientObject* self, PyObject* a) {
  long long ms;
  if (IntArg(a, 0, UINT32_MAX, &ms) != 0) return NULL;
  tm_client* h = self->h;
  if (h == NULL) Py_RETURN_NONE;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = tm_client_flush(h, (uint32_t)ms);
  Py_END_ALLOW_THREADS return PyLong_FromLong(rc);
}

/* _attach() -> status. */
static PyObject* Client_attach(ClientObject* self, PyObject* unused) {
  (void)unused;
  if (self->h == NULL) return PyLong_FromLong(TM_E_CLOSED);
  return PyLong_FromLong(tm_thread_attach(self->h));
}

static PyObject* Client_get_closed(ClientObject* self, void* unused) {
  (void)unused;
  return PyBool_FromLong(self->h == NULL);
}

/* ---- events --------------------------------------------------------------
 */

/* tokens(rid, n=1, t_ns=0) */
static PyObject* Client_tokens(ClientObject* self, PyObject* const* args,
                               size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[3];
  PyObject* const names[3] = {s_rid, s_n, s_t_ns};
  Rid r;
  uint32_t n = 1;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 3, 3, a) != 0 || a[0] == NULL ||
      RidOf(a[0], &r) != 0 || (a[1] != NULL && U32Of(a[1], 1, &n) != 0) ||
      TimeOf(a[2], &t) != 0) {
    return Slow((PyObject*)self, s_tokens_slow, args, nargsf, kwnames);
  }
  int rc = r.s ? tm_tokens_str(self->h, t, r.s, (size_t)r.len, n)
               : tm_tokens(self->h, t, r.v, n);
  return PyLong_FromLong(rc);
}

/* queued / scheduled / preempted (rid, t_ns=0) */
typedef int (*RidEventInt)(tm_client*, uint64_t, uint64_t);
typedef int (*RidEventStr)(tm_client*, uint64_t, const char*, size_t);

static PyObject* RidEvent(ClientObject* self, PyObject* const* args,
                          size_t nargsf, PyObject* kwnames, RidEventInt fi,
                          RidEventStr fs, PyObject* slow) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[2];
  PyObject* const names[2] = {s_rid, s_t_ns};
  Rid r;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 2, 2, a) != 0 || a[0] == NULL ||
      RidOf(a[0], &r) != 0 || TimeOf(a[1], &t) != 0) {
    return Slow((PyObject*)self, slow, args, nargsf, kwnames);
  }
  int rc = r.s ? fs(self->h, t, r.s, (size_t)r.len) : fi(self->h, t, r.v);
  return PyLong_FromLong(rc);
}

static PyObject* Client_queued(ClientObject* self, PyObject* const* args,
                               size_t nargsf, PyObject* kwnames) {
  return RidEvent(self, args, nargsf, kwnames, tm_queued, tm_queued_str,
                  s_queued_slow);
}

/* scheduled(rid, t_ns=0, cached_tokens=None, external_tokens=None): with
 * both counts, the 1.2 form (tm_scheduled_ex); one without the other is
 * the slow path's TypeError. */
static PyObject* Client_scheduled(ClientObject* self, PyObject* const* args,
                                  size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[4];
  PyObject* const names[4] = {s_rid, s_t_ns, s_cached_tokens,
                              s_external_tokens};
  Rid r;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 4, 4, a) != 0 || a[0] == NULL ||
      RidOf(a[0], &r) != 0 || TimeOf(a[1], &t) != 0) {
    goto slow;
  }
  PyObject* cached = a[2] == Py_None ? NULL : a[2];
  PyObject* external = a[3] == Py_None ? NULL : a[3];
  int rc;
  if (cached == NULL && external == NULL) {
    rc = r.s ? tm_scheduled_str(self->h, t, r.s, (size_t)r.len)
             : tm_scheduled(self->h, t, r.v);
    return PyLong_FromLong(rc);
  }
  uint32_t c, e;
  if (cached == NULL || external == NULL || U32Of(cached, 0, &c) != 0 ||
      U32Of(external, 0, &e) != 0) {
    goto slow;
  }
  rc = r.s ? tm_scheduled_ex_str(self->h, t, r.s, (size_t)r.len, c, e)
           : tm_scheduled_ex(self->h, t, r.v, c, e);
  return PyLong_FromLong(rc);
slow:
  return Slow((PyObject*)self, s_scheduled_slow, args, nargsf, kwnames);
}

static PyObject* Client_preempted(ClientObject* self, PyObject* const* args,
                                  size_t nargsf, PyObject* kwnames) {
  return RidEvent(self, args, nargsf, kwnames, tm_preempted, tm_preempted_str,
                  s_preempted_slow);
}

/* The reason as tm_finish_reason: one of the four strs, or an exact int
 * 0 .. 3 (FinishReason members take the slow path, which maps them). */
static int ReasonOf(PyObject* o, tm_finish_reason* out) {
  if (o == NULL || o == s_stop) {
    *out = TM_FINISH_STOP;
  } else if (o == s_length) {
    *out = TM_FINISH_LENGTH;
  } else if (o == s_abort) {
    *out = TM_FINISH_ABORT;
  } else if (o == s_error) {
    *out = TM_FINISH_ERROR;
  } else if (PyUnicode_CheckExact(o)) {
    if (PyUnicode_CompareWithASCIIString(o, "stop") == 0) {
      *out = TM_FINISH_STOP;
    } else if (PyUnicode_CompareWithASCIIString(o, "length") == 0) {
      *out = TM_FINISH_LENGTH;
    } else if (PyUnicode_CompareWithASCIIString(o, "abort") == 0) {
      *out = TM_FINISH_ABORT;
    } else if (PyUnicode_CompareWithASCIIString(o, "error") == 0) {
      *out = TM_FINISH_ERROR;
    } else {
      return -1;
    }
  } else {
    uint64_t v;
    if (U64Of(o, &v) != 0 || v > TM_FINISH_ERROR) return -1;
    *out = (tm_finish_reason)v;
  }
  return 0;
}

/* finished(rid, reason="stop", t_ns=0) */
static PyObject* Client_finished(ClientObject* self, PyObject* const* args,
                                 size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[3];
  PyObject* const names[3] = {s_rid, s_reason, s_t_ns};
  Rid r;
  tm_finish_reason reason;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 3, 3, a) != 0 || a[0] == NULL ||
      RidOf(a[0], &r) != 0 || ReasonOf(a[1], &reason) != 0 ||
      TimeOf(a[2], &t) != 0) {
    return Slow((PyObject*)self, s_finished_slow, args, nargsf, kwnames);
  }
  int rc = r.s ? tm_finished_str(self->h, t, r.s, (size_t)r.len, reason)
               : tm_finished(self->h, t, r.v, reason);
  return PyLong_FromLong(rc);
}

/* A str of lo .. hi bytes of UTF-8 without NUL, as a C string. */
static const char* CStrOf(PyObject* o, Py_ssize_t lo, Py_ssize_t hi) {
  if (!PyUnicode_CheckExact(o)) return NULL;
  Py_ssize_t len;
  const char* s = PyUnicode_AsUTF8AndSize(o, &len);
  if (s == NULL) {
    PyErr_Clear();
    return NULL;
  }
  if (len < lo || len > hi || strlen(s) != (size_t)len) return NULL;
  return s;
}

/* An exact int in int32_t's range, into *out; -1 for the slow path. */
static int I32Of(PyObject* o, int32_t* out) {
  if (!PyLong_CheckExact(o)) return -1;
  int overflow;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) {
    PyErr_Clear();
    return -1;
  }
  *out = (int32_t)v;
  return 0;
}

/* arrived(rid, prompt_tokens, max_tokens=0, n=0, t_ns=0, lora=None,
 *         labels=None, priority=None, traceparent=None, tracestate=None) */
static PyObject* Client_arrived(ClientObject* self, PyObject* const* args,
                                size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[10];
  PyObject* const names[10] = {
      s_rid,  s_prompt_tokens, s_max_tokens, s_n,           s_t_ns,
      s_lora, s_labels,        s_priority,   s_traceparent, s_tracestate};
  Rid r;
  uint32_t prompt, max_tokens = 0, n = 0;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 10, 10, a) != 0 || a[0] == NULL ||
      a[1] == NULL || RidOf(a[0], &r) != 0 || U32Of(a[1], 0, &prompt) != 0 ||
      (a[2] != NULL && U32Of(a[2], 0, &max_tokens) != 0) ||
      (a[3] != NULL && U32Of(a[3], 0, &n) != 0) || TimeOf(a[4], &t) != 0) {
    goto slow;
  }
  PyObject* lora_o = a[5] == Py_None ? NULL : a[5];
  PyObject* labels_o = a[6] == Py_None ? NULL : a[6];
  PyObject* priority_o = a[7] == Py_None ? NULL : a[7];
  PyObject* traceparent_o = a[8] == Py_None ? NULL : a[8];
  PyObject* tracestate_o = a[9] == Py_None ? NULL : a[9];
  int rc;
  if (lora_o == NULL && labels_o == NULL && priority_o == NULL &&
      traceparent_o == NULL && tracestate_o == NULL) {
    rc = r.s ? tm_arrived_str(self->h, t, r.s, (size_t)r.len, prompt,
                              max_tokens, n)
             : tm_arrived(self->h, t, r.v, prompt, max_tokens, n);
    return PyLong_FromLong(rc);
  }
  const char* lora = NULL;
  if (lora_o != NULL) {
    lora = CStrOf(lora_o, 1, TM_MAX_LORA_BYTES);
    if (lora == NULL) goto slow;
  }
  tm_label labels[TM_MAX_REQUEST_LABELS];
  size_t n_labels = 0;
  if (labels_o != NULL) {
    if (!PyDict_CheckExact(labels_o) ||
        PyDict_GET_SIZE(labels_o) > (Py_ssize_t)TM_MAX_REQUEST_LABELS) {
      goto slow;
    }
    Py_ssize_t pos = 0;
    PyObject* key;
    PyObject* value;
    while (PyDict_Next(labels_o, &pos, &key, &value)) {
      labels[n_labels].name = CStrOf(key, 1, TM_MAX_STRING_BYTES);
      labels[n_labels].value =
          CStrOf(value, 0, TM_MAX_REQUEST_LABEL_VALUE_BYTES);
      if (labels[n_labels].name == NULL || labels[n_labels].value == NULL) {
        goto slow;
      }
      ++n_labels;
    }
  }
  tm_request_params p = TM_REQUEST_PARAMS_INIT;
  p.max_tokens = max_tokens;
  p.n = n;
  p.lora = lora;
  p.labels = labels;
  p.n_labels = n_labels;
  if (priority_o != NULL) {
    if (I32Of(priority_o, &p.priority) != 0) goto slow;
    p.has_priority = 1;
  }
  /* Any length: the library applies protocol.h's rules and leaves a
   * malformed trace string out (counted). The slow path raises for what is
   * no str and passes one holding a NUL (or not encodable) as one that
   * breaks the rule for certain. */
  if (traceparent_o != NULL) {
    p.traceparent = CStrOf(traceparent_o, 0, PY_SSIZE_T_MAX);
    if (p.traceparent == NULL) goto slow;
  }
  if (tracestate_o != NULL) {
    p.tracestate = CStrOf(tracestate_o, 0, PY_SSIZE_T_MAX);
    if (p.tracestate == NULL) goto slow;
  }
  rc = r.s ? tm_arrived_params_str(self->h, t, r.s, (size_t)r.len, prompt, &p)
           : tm_arrived_params(self->h, t, r.v, prompt, &p);
  if (rc == TM_E_INVALID && self->h != NULL) {
    /* What is left for the library (which counted it as rejected): the
     * label-name rules of protocol.h. */
    PyObject* none = Py_None;
    PyObject* call[2] = {(PyObject*)self, labels_o ? labels_o : none};
    return PyObject_VectorcallMethod(s_arrived_refused, call, 2, NULL);
  }
  return PyLong_FromLong(rc);
slow:
  return Slow((PyObject*)self, s_arrived_slow, args, nargsf, kwnames);
}

/* One packed buffer of string ids for tm_tokens_batch_str: "a\0b\0". */
static int PackStrIds(PyObject** items, Py_ssize_t count, char* local,
                      size_t local_size, char** out, size_t* out_len,
                      char** mem) {
  size_t total = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!PyUnicode_CheckExact(items[i])) return kSlow;
    Py_ssize_t len;
    if (PyUnicode_AsUTF8AndSize(items[i], &len) == NULL) {
      PyErr_Clear();
      return kSlow;
    }
    total += (size_t)len + 1;
  }
  char* buf = local;
  *mem = NULL;
  if (total > local_size) {
    buf = *mem = PyMem_Malloc(total);
    if (buf == NULL) {
      PyErr_NoMemory();
      return kRaised;
    }
  }
  char* p = buf;
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_ssize_t len;
    const char* s = PyUnicode_AsUTF8AndSize(items[i], &len); /* cached */
    memcpy(p, s, (size_t)len);
    p += len;
    *p++ = '\0';
  }
  *out = buf;
  *out_len = total;
  return kTaken;
}

/* tokens_batch(rids, n=None, t_ns=0) */
static PyObject* Client_tokens_batch(ClientObject* self, PyObject* const* args,
                                     size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[3];
  PyObject* const names[3] = {s_rids, s_n, s_t_ns};
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 3, 3, a) != 0 || a[0] == NULL ||
      TimeOf(a[2], &t) != 0) {
    return Slow((PyObject*)self, s_tokens_batch_slow, args, nargsf, kwnames);
  }
  PyObject* rids = a[0];
  PyObject* n_o = a[1] == Py_None ? NULL : a[1];
  PyObject* result = NULL;
  Py_buffer n_view = {.obj = NULL};
  Py_buffer id_view = {.obj = NULL};
  Ints n_ints = {.mem = NULL};
  Ints ids = {.mem = NULL};
  const uint32_t* n_ptr = NULL;
  Py_ssize_t n_count = -1; /* -1: none given; -2: n_all for every id */
  uint32_t n_all = 1;
  int st;

  /* Token counts: None (1 each), one int, or one per id. */
  if (n_o != NULL) {
    uint64_t all;
    if (U64Of(n_o, &all) == 0) {
      if (all > UINT32_MAX) goto slow;
      if (all == 0) return PyLong_FromLong(0);
      n_all = (uint32_t)all;
      if (n_all != 1) n_count = -2; /* filled once the count is known */
    } else {
      st = IntsOf(n_o, 4, UINT32_MAX, 0, "n", &n_view, &n_ints);
      if (st == kRaised) goto done;
      if (st == kSlow) goto slow;
      n_ptr = n_ints.p;
      n_count = n_ints.n;
    }
  }

  /* Ids: a list (or tuple) of strs, else integers. */
  Py_ssize_t count;
  if ((PyList_CheckExact(rids) || PyTuple_CheckExact(rids)) &&
      PySequence_Fast_GET_SIZE(rids) > 0 &&
      PyUnicode_CheckExact(PySequence_Fast_ITEMS(rids)[0])) {
    count = PySequence_Fast_GET_SIZE(rids);
    if ((n_count >= 0 && n_count != count) ||
        count > (Py_ssize_t)TM_MAX_BATCH_EVENTS) {
      goto slow;
    }
    if (n_count == -2) goto slow; /* one count for all: rare, see below */
    char local[8192];
    char* packed;
    char* mem;
    size_t len;
    st = PackStrIds(PySequence_Fast_ITEMS(rids), count, local, sizeof local,
                    &packed, &len, &mem);
    if (st == kRaised) goto done;
    if (st == kSlow) goto slow;
    int rc = tm_tokens_batch_str(self->h, t, packed, len, n_ptr, (size_t)count);
    if (mem != NULL) PyMem_Free(mem);
    if (rc < 0 && self->h != NULL) {
      /* The library refused the whole batch (and counted it): say why. */
      ViewRelease(&n_view);
      IntsFree(&n_ints);
      return PyObject_CallMethodOneArg((PyObject*)self, s_tokens_batch_diagnose,
                                       rids);
    }
    result = PyLong_FromLong(rc > 0 ? rc : 0);
    goto done;
  }
  if (PyUnicode_Check(rids)) goto slow; /* one str: the slow path raises */
  st = IntsOf(rids, 8, UINT64_MAX, 1, "rids", &id_view, &ids);
  if (st == kRaised) goto done;
  if (st == kSlow) goto slow;
  count = ids.n;
  if ((n_count >= 0 && n_count != count) ||
      count > (Py_ssize_t)TM_MAX_BATCH_EVENTS) {
    goto slow;
  }
  if (n_count == -2) {
    /* One count (> 1) for every id. */
    uint32_t* fill = IntsSpace(&n_ints, count, 4);
    if (fill == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; ++i) fill[i] = n_all;
    n_ptr = fill;
  }
  {
    int rc = tm_tokens_batch(self->h, t, ids.p, n_ptr, (size_t)count);
    result = PyLong_FromLong(rc > 0 ? rc : 0);
  }
  goto done;
slow:
  ViewRelease(&n_view);
  ViewRelease(&id_view);
  IntsFree(&n_ints);
  IntsFree(&ids);
  return Slow((PyObject*)self, s_tokens_batch_slow, args, nargsf, kwnames);
done:
  ViewRelease(&n_view);
  ViewRelease(&id_view);
  IntsFree(&n_ints);
  IntsFree(&ids);
  return result;
}

/* step(*, running=None, ..., spec_accepted_per_pos=None, t_ns=0) */
static PyObject* Client_step(ClientObject* self, PyObject* const* args,
                             size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  enum { kPos = TM_STEP_KEY_COUNT, kTime = TM_STEP_KEY_COUNT + 1 };
  PyObject* a[TM_STEP_KEY_COUNT + 2];
  PyObject* names[TM_STEP_KEY_COUNT + 2];
  for (int i = 0; i < TM_STEP_KEY_COUNT; ++i) names[i] = s_step_keys[i];
  names[kPos] = s_spec_accepted_per_pos;
  names[kTime] = s_t_ns;
  tm_step_key keys[TM_STEP_KEY_COUNT];
  double values[TM_STEP_KEY_COUNT];
  size_t n_keys = 0;
  uint64_t pos[TM_MAX_SPEC_POSITIONS];
  size_t n_pos = 0;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, TM_STEP_KEY_COUNT + 2, 0, a) != 0 ||
      TimeOf(a[kTime], &t) != 0) {
    goto slow;
  }
  for (int k = 0; k < TM_STEP_KEY_COUNT; ++k) {
    PyObject* v = a[k];
    if (v == NULL || v == Py_None) continue;
    double d;
    if (k == TM_STEP_KEY_KV_USAGE && PyFloat_CheckExact(v)) {
      d = PyFloat_AS_DOUBLE(v);
      if (!(d >= 0.0 && d <= 1.0)) goto slow;
    } else {
      uint64_t x;
      if (U64Of(v, &x) != 0 || x > TM_MAX_EVENT_COUNT) goto slow;
      if (k == TM_STEP_KEY_KV_USAGE && x > 1) goto slow;
      d = (double)x;
    }
    keys[n_keys] = (tm_step_key)k;
    values[n_keys] = d;
    ++n_keys;
  }
  {
    /* 1.2: waiting_deferred, a part of waiting; the slow path says why
     * when it is not. */
    PyObject* d = a[TM_STEP_KEY_WAITING_DEFERRED];
    if (d != NULL && d != Py_None) {
      PyObject* w = a[TM_STEP_KEY_WAITING];
      uint64_t dv, wv;
      if (w == NULL || w == Py_None || U64Of(d, &dv) != 0 ||
          U64Of(w, &wv) != 0 || dv > wv) {
        goto slow;
      }
    }
  }
  PyObject* p = a[kPos];
  if (p != NULL && p != Py_None) {
    if (!PyList_CheckExact(p) && !PyTuple_CheckExact(p)) goto slow;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(p);
    if (np > (Py_ssize_t)TM_MAX_SPEC_POSITIONS) goto slow;
    PyObject** items = PySequence_Fast_ITEMS(p);
    for (Py_ssize_t i = 0; i < np; ++i) {
      if (U64Of(items[i], &pos[i]) != 0 || pos[i] > TM_MAX_EVENT_COUNT) {
        goto slow;
      }
    }
    n_pos = (size_t)np;
  }
  return PyLong_FromLong(tm_step(self->h, t, keys, values, n_keys, pos, n_pos));
slow:
  return Slow((PyObject*)self, s_step_slow, args, nargsf, kwnames);
}

/* expert_load(layer, counts, t_ns=0) */
static PyObject* Client_expert_load(ClientObject* self, PyObject* const* args,
                                    size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[3];
  PyObject* const names[3] = {s_layer, s_counts, s_t_ns};
  uint64_t layer;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 3, 3, a) != 0 || a[0] == NULL ||
      a[1] == NULL || U64Of(a[0], &layer) != 0 || layer >= TM_MAX_MOE_LAYERS ||
      TimeOf(a[2], &t) != 0) {
    return Slow((PyObject*)self, s_expert_load_slow, args, nargsf, kwnames);
  }
  Py_buffer view;
  Ints counts;
  /* The library checks each count against 2^32 - 1 (and counts a refusal),
   * so any uint64 is passed. */
  int st = IntsOf(a[1], 8, UINT64_MAX, 1, "counts", &view, &counts);
  if (st == kRaised) {
    ViewRelease(&view); /* a refused buffer stays exported until here */
    return NULL;
  }
  if (st == kSlow || counts.n < 1 ||
      counts.n > (Py_ssize_t)TM_MAX_MOE_EXPERTS) {
    ViewRelease(&view);
    IntsFree(&counts);
    return Slow((PyObject*)self, s_expert_load_slow, args, nargsf, kwnames);
  }
  int rc =
      tm_expert_load(self->h, t, (uint32_t)layer, counts.p, (size_t)counts.n);
  ViewRelease(&view);
  IntsFree(&counts);
  if (rc == TM_E_INVALID && self->h != NULL) {
    /* Layer and length were checked: the library refused a count. */
    PyErr_SetString(PyExc_ValueError,
                    "expert counts must be ints 0 .. 2**32-1 (the event was "
                    "counted as rejected)");
    return NULL;
  }
  return PyLong_FromLong(rc);
}

/* ---- protocol 1.2 events --------------------------------------------------
 * A string the library refuses (protocol.h's label-value rule) is counted
 * there; the subclass's _*_refused helpers then raise naming the rule. */

/* A reason or connector: absent or None (NULL and 0: none), an exact str of
 * 1 .. 64 bytes (*out), or an exact int id 1 .. TM_MAX_VALUE_IDS (*id,
 * register_value()'s); -1 for the slow path. */
static int LabelValueOf(PyObject* o, const char** out, uint32_t* id) {
  *out = NULL;
  *id = 0;
  if (o == NULL || o == Py_None) return 0;
  if (PyLong_CheckExact(o)) {
    return U32Of(o, 1, id) != 0 || *id > TM_MAX_VALUE_IDS ? -1 : 0;
  }
  *out = CStrOf(o, 1, TM_MAX_LABEL_VALUE_BYTES);
  return *out == NULL ? -1 : 0;
}

/* _register_value(value) -> id or status: value an exact str (the subclass
 * checked it); raises naming the rule when the library refuses it. */
static PyObject* Client_register_value(ClientObject* self, PyObject* value) {
  const char* s = CStrOf(value, 1, TM_MAX_LABEL_VALUE_BYTES);
  if (s == NULL) {
    PyErr_SetString(PyExc_ValueError, "_register_value takes a checked str");
    return NULL;
  }
  const int rc = tm_register_value(self->h, s);
  if (rc == TM_E_INVALID && self->h != NULL) {
    PyObject* call[3] = {(PyObject*)self, s_value_name, value};
    return PyObject_VectorcallMethod(s_label_value_refused, call, 3, NULL);
  }
  return PyLong_FromLong(rc);
}

/* admission_rejected(reason, rid=None, t_ns=0) */
static PyObject* Client_admission_rejected(ClientObject* self,
                                           PyObject* const* args, size_t nargsf,
                                           PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[3];
  PyObject* const names[3] = {s_reason, s_rid, s_t_ns};
  Rid r = {.s = NULL};
  uint64_t t;
  const char* reason;
  uint32_t reason_id;
  if (Bind(args, nargs, kwnames, names, 3, 3, a) != 0 || a[0] == NULL ||
      a[0] == Py_None || LabelValueOf(a[0], &reason, &reason_id) != 0 ||
      TimeOf(a[2], &t) != 0) {
    goto slow;
  }
  PyObject* rid_o = a[1] == Py_None ? NULL : a[1];
  if (rid_o != NULL && RidOf(rid_o, &r) != 0) goto slow;
  int rc;
  if (reason == NULL) {
    if (rid_o == NULL) {
      rc = tm_admission_rejected_id(self->h, t, reason_id);
    } else if (r.s != NULL) {
      rc = tm_admission_rejected_id_str(self->h, t, reason_id, r.s,
                                        (size_t)r.len);
    } else {
      rc = tm_admission_rejected_id_rid(self->h, t, reason_id, r.v);
    }
  } else if (rid_o == NULL) {
    rc = tm_admission_rejected(self->h, t, reason);
  } else if (r.s != NULL) {
    rc = tm_admission_rejected_str(self->h, t, reason, r.s, (size_t)r.len);
  } else {
    rc = tm_admission_rejected_rid(self->h, t, reason, r.v);
  }
  if (rc == TM_E_INVALID && self->h != NULL) {
    PyObject* call[3] = {(PyObject*)self, s_reason_name, a[0]};
    return PyObject_VectorcallMethod(s_label_value_refused, call, 3, NULL);
  }
  return PyLong_FromLong(rc);
slow:
  return Slow((PyObject*)self, s_admission_rejected_slow, args, nargsf,
              kwnames);
}

/* bytes / blocks: absent or None (TM_KV_UNKNOWN), or an exact int in range.
 * -1 for the slow path. */
static int KvAmountOf(PyObject* o, uint64_t* out) {
  if (o == NULL || o == Py_None) {
    *out = TM_KV_UNKNOWN;
    return 0;
  }
  return U64Of(o, out) != 0 || *out > TM_MAX_KV_TRANSFER_BYTES ? -1 : 0;
}

/* kv_transfer(rid, role, start_ns, t_ns=0, bytes=None, blocks=None,
 *             ok=True, reason=None, connector=None) */
static PyObject* Client_kv_transfer(ClientObject* self, PyObject* const* args,
                                    size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  enum { kRid, kRole, kStart, kTime, kBytes, kBlocks, kOk, kReason, kConn };
  PyObject* a[9];
  PyObject* const names[9] = {s_rid,    s_role, s_start_ns, s_t_ns,     s_bytes,
                              s_blocks, s_ok,   s_reason,   s_connector};
  Rid r;
  uint64_t t;
  tm_kv_transfer_info kv = TM_KV_TRANSFER_INFO_INIT;
  if (Bind(args, nargs, kwnames, names, 9, 9, a) != 0 || a[kRid] == NULL ||
      a[kRole] == NULL || a[kStart] == NULL || RidOf(a[kRid], &r) != 0 ||
      U64Of(a[kStart], &kv.start_ns) != 0 || TimeOf(a[kTime], &t) != 0 ||
      (t != 0 && kv.start_ns > t) || KvAmountOf(a[kBytes], &kv.bytes) != 0 ||
      KvAmountOf(a[kBlocks], &kv.blocks) != 0 ||
      LabelValueOf(a[kReason], &kv.reason, &kv.reason_id) != 0 ||
      LabelValueOf(a[kConn], &kv.connector, &kv.connector_id) != 0) {
    goto slow;
  }
  PyObject* role = a[kRole];
  if (PyUnicode_CheckExact(role) &&
      PyUnicode_CompareWithASCIIString(role, TM_KV_ROLE_SEND) == 0) {
    kv.role = TM_KV_SEND;
  } else if (PyUnicode_CheckExact(role) &&
             PyUnicode_CompareWithASCIIString(role, TM_KV_ROLE_RECV) == 0) {
    kv.role = TM_KV_RECV;
  } else {
    goto slow;
  }
  if (a[kOk] == NULL || a[kOk] == Py_True) {
    kv.ok = 1;
  } else if (a[kOk] == Py_False) {
    kv.ok = 0;
  } else {
    goto slow;
  }
  int rc = r.s ? tm_kv_transfer_str(self->h, t, r.s, (size_t)r.len, &kv)
               : tm_kv_transfer(self->h, t, r.v, &kv);
  if (rc == TM_E_INVALID && self->h != NULL) {
    PyObject* none = Py_None;
    PyObject* call[5] = {
        (PyObject*)self, a[kStart], a[kTime] ? a[kTime] : PyLong_FromLong(0),
        a[kReason] ? a[kReason] : none, a[kConn] ? a[kConn] : none};
    if (call[2] == NULL) return NULL;
    PyObject* result =
        PyObject_VectorcallMethod(s_kv_transfer_refused, call, 5, NULL);
    if (a[kTime] == NULL) Py_DECREF(call[2]);
    return result;
  }
  return PyLong_FromLong(rc);
slow:
  return Slow((PyObject*)self, s_kv_transfer_slow, args, nargsf, kwnames);
}

/* One sleep_state() part: absent or None (keep, -1), or an exact str equal
 * to one of `values` (its index). -1 for the slow path. */
static int SleepPartOf(PyObject* o, const char* const* values, int n,
                       int* out) {
  if (o == NULL || o == Py_None) {
    *out = -1;
    return 0;
  }
  if (!PyUnicode_CheckExact(o)) return -1;
  for (int i = 0; i < n; ++i) {
    if (PyUnicode_CompareWithASCIIString(o, values[i]) == 0) {
      *out = i;
      return 0;
    }
  }
  return -1;
}

/* sleep_state(scheduler=None, weights=None, kv_cache=None, t_ns=0) */
static PyObject* Client_sleep_state(ClientObject* self, PyObject* const* args,
                                    size_t nargsf, PyObject* kwnames) {
  static const char* const kScheduler[] = {TM_SLEEP_RUNNING, TM_SLEEP_PAUSED};
  static const char* const kWeights[] = {TM_SLEEP_RESIDENT, TM_SLEEP_OFFLOADED,
                                         TM_SLEEP_DISCARDED};
  static const char* const kKvCache[] = {TM_SLEEP_RESIDENT, TM_SLEEP_RELEASED};
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[4];
  PyObject* const names[4] = {s_scheduler, s_weights, s_kv_cache, s_t_ns};
  int sched, weights, kv_cache;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 4, 4, a) != 0 ||
      SleepPartOf(a[0], kScheduler, 2, &sched) != 0 ||
      SleepPartOf(a[1], kWeights, 3, &weights) != 0 ||
      SleepPartOf(a[2], kKvCache, 2, &kv_cache) != 0 || TimeOf(a[3], &t) != 0) {
    return Slow((PyObject*)self, s_sleep_state_slow, args, nargsf, kwnames);
  }
  return PyLong_FromLong(tm_sleep_state(self->h, t, (tm_scheduler_state)sched,
                                        (tm_weights_state)weights,
                                        (tm_kv_cache_state)kv_cache));
}

#define TM_FASTCALL(f) \
  (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

/* ---- protocol 1.3 ---------------------------------------------------------
 */

/* An optional figure: absent or None (TM_NOT_GIVEN), or an exact int 0 ..
 * max; -1 for the slow path. */
static int GivenOf(PyObject* o, uint64_t max, uint64_t* out) {
  if (o == NULL || o == Py_None) {
    *out = TM_NOT_GIVEN;
    return 0;
  }
  return U64Of(o, out) != 0 || *out > max ? -1 : 0;
}

/* request_summary(reason, *, prompt_tokens, generation_tokens,
 *   cached_tokens=None, max_tokens=None, n=None, ttft_ns=None,
 *   queue_ns=None, prefill_ns=None, decode_ns=None, inference_ns=None,
 *   e2e_ns=None, tpot_ns=None, rid=None, t_ns=0,
 *   max_generation_tokens=None). Every rule is checked here (the slow path
 * raises naming it), so the library refuses nothing but a closed client. */
static PyObject* Client_request_summary(ClientObject* self,
                                        PyObject* const* args, size_t nargsf,
                                        PyObject* kwnames) {
  enum { kReason, kPrompt, kGeneration, kFields, kRid = kFields + 11, kT, kN };
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[kN];
  PyObject* names[kN];
  names[kReason] = s_reason;
  names[kPrompt] = s_prompt_tokens;
  names[kGeneration] = s_generation_tokens;
  for (int i = 0; i < 11; ++i) names[kFields + i] = s_summary_fields[i];
  names[kRid] = s_rid;
  names[kT] = s_t_ns;
  tm_request_summary_info q = TM_REQUEST_SUMMARY_INFO_INIT;
  uint64_t* const fields[11] = {
      &q.cached_tokens, &q.max_tokens, &q.n,          &q.max_generation_tokens,
      &q.ttft_ns,       &q.queue_ns,   &q.prefill_ns, &q.decode_ns,
      &q.inference_ns,  &q.e2e_ns,     &q.tpot_ns};
  Rid r = {0, NULL, 0};
  uint64_t t;
  int slow =
      Bind(args, nargs, kwnames, names, kN, 1, a) != 0 || a[kReason] == NULL ||
      a[kPrompt] == NULL || a[kGeneration] == NULL ||
      ReasonOf(a[kReason], &q.reason) != 0 ||
      GivenOf(a[kPrompt], TM_MAX_EVENT_COUNT, &q.prompt_tokens) != 0 ||
      GivenOf(a[kGeneration], TM_MAX_EVENT_COUNT, &q.generation_tokens) != 0 ||
      a[kPrompt] == Py_None || a[kGeneration] == Py_None ||
      TimeOf(a[kT], &t) != 0 ||
      (a[kRid] != NULL && a[kRid] != Py_None && RidOf(a[kRid], &r) != 0);
  for (int i = 0; i < 11 && !slow; ++i) {
    slow =
        GivenOf(a[kFields + i], i < 4 ? TM_MAX_EVENT_COUNT : TM_MAX_DURATION_NS,
                fields[i]) != 0;
  }
  if (slow ||
      (q.cached_tokens != TM_NOT_GIVEN && q.cached_tokens > q.prompt_tokens)) {
    return Slow((PyObject*)self, s_request_summary_slow, args, nargsf, kwnames);
  }
  int rc;
  if (a[kRid] == NULL || a[kRid] == Py_None) {
    rc = tm_request_summary(self->h, t, &q);
  } else if (r.s != NULL) {
    rc = tm_request_summary_str(self->h, t, r.s, (size_t)r.len, &q);
  } else {
    rc = tm_request_summary_rid(self->h, t, r.v, &q);
  }
  return PyLong_FromLong(rc);
}

/* latencies(ttft_ns=(), itl_ns=(), t_ns=0, *, prompt_tokens=None,
 *           generation_tokens=None, preemptions=None): at most
 * TM_MAX_LATENCIES values here; more take the slow path, which splits
 * them into several events. */
static PyObject* Client_latencies(ClientObject* self, PyObject* const* args,
                                  size_t nargsf, PyObject* kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* a[6];
  PyObject* const names[6] = {
      s_ttft_ns,           s_itl_ns,     s_t_ns, s_prompt_tokens,
      s_generation_tokens, s_preemptions};
  tm_iteration_counts c = TM_ITERATION_COUNTS_INIT;
  uint64_t t;
  if (Bind(args, nargs, kwnames, names, 6, 3, a) != 0 ||
      TimeOf(a[2], &t) != 0 ||
      GivenOf(a[3], TM_MAX_EVENT_COUNT, &c.prompt_tokens) != 0 ||
      GivenOf(a[4], TM_MAX_EVENT_COUNT, &c.generation_tokens) != 0 ||
      GivenOf(a[5], TM_MAX_EVENT_COUNT, &c.preemptions) != 0) {
    return Slow((PyObject*)self, s_latencies_slow, args, nargsf, kwnames);
  }
  Py_buffer tv, iv;
  Ints ttft, itl;
  tv.obj = iv.obj = NULL;
  ttft.mem = itl.mem = NULL;
  ttft.n = itl.n = 0;
  ttft.p = itl.p = NULL;
  int st = kTaken;
  if (a[0] != NULL) {
    st = IntsOf(a[0], 8, TM_MAX_DURATION_NS, 0, "ttft_ns", &tv, &ttft);
  }
  if (st == kTaken && a[1] != NULL) {
    st = IntsOf(a[1], 8, TM_MAX_DURATION_NS, 0, "itl_ns", &iv, &itl);
  }
  PyObject* result = NULL;
  if (st == kTaken && ttft.n + itl.n <= (Py_ssize_t)TM_MAX_LATENCIES) {
    const int has_counts = c.prompt_tokens != TM_NOT_GIVEN ||
                           c.generation_tokens != TM_NOT_GIVEN ||
                           c.preemptions != TM_NOT_GIVEN;
    result =
        PyLong_FromLong(tm_latencies(self->h, t, ttft.p, (size_t)ttft.n, itl.p,
                                     (size_t)itl.n, has_counts ? &c : NULL));
  }
  ViewRelease(&tv);
  ViewRelease(&iv);
  IntsFree(&ttft);
  IntsFree(&itl);
  if (st == kRaised) return NULL;
  if (result != NULL) return result;
  return Slow((PyObject*)self, s_latencies_slow, args, nargsf, kwnames);
}

static PyMethodDef Client_methods[] = {
    {"_open", (PyCFunction)Client_open, METH_O, NULL},
    {"_handle", (PyCFunction)Client_handle, METH_NOARGS, NULL},
    {"_close", (PyCFunction)Client_close, METH_NOARGS, NULL},
    {"_forget", (PyCFunction)Client_forget, METH_NOARGS, NULL},
    {"_stats", (PyCFunction)Client_stats, METH_NOARGS, NULL},
    {"_flush", (PyCFunction)Client_flush, METH_O, NULL},
    {"_attach", (PyCFunction)Client_attach, METH_NOARGS, NULL},
    {"_register_value", (PyCFunction)Client_register_value, METH_O, NULL},
    {"tokens", TM_FASTCALL(Client_tokens),
     "tokens($self, rid, n=1, t_ns=0)\n--\n\nn >= 1 output tokens of the "
     "request in one step."},
    {"tokens_batch", TM_FASTCALL(Client_tokens_batch),
     "tokens_batch($self, rids, n=None, t_ns=0)\n--\n\nOne engine step's "
     "output tokens in one call."},
    {"arrived", TM_FASTCALL(Client_arrived),
     "arrived($self, rid, prompt_tokens, max_tokens=0, n=0, t_ns=0, lora=None, "
     "labels=None, priority=None, traceparent=None, tracestate=None)\n--\n\n"
     "The request entered the server."},
    {"queued", TM_FASTCALL(Client_queued),
     "queued($self, rid, t_ns=0)\n--\n\nThe request entered the waiting "
     "queue."},
    {"scheduled", TM_FASTCALL(Client_scheduled),
     "scheduled($self, rid, t_ns=0, cached_tokens=None, "
     "external_tokens=None)\n--\n\nThe request was scheduled."},
    {"preempted", TM_FASTCALL(Client_preempted),
     "preempted($self, rid, t_ns=0)\n--\n\nThe request lost its KV cache."},
    {"finished", TM_FASTCALL(Client_finished),
     "finished($self, rid, reason='stop', t_ns=0)\n--\n\nThe request "
     "finished."},
    {"step", TM_FASTCALL(Client_step),
     "step($self, *, running=None, waiting=None, kv_usage=None, "
     "prompt_tokens=None, generation_tokens=None, prefix_queries=None, "
     "prefix_hits=None, spec_drafts=None, spec_draft_tokens=None, "
     "spec_accepted_tokens=None, spec_accepted_per_pos=None, "
     "t_ns=0, waiting_deferred=None)\n--\n\nOne scheduler iteration."},
    {"expert_load", TM_FASTCALL(Client_expert_load),
     "expert_load($self, layer, counts, t_ns=0)\n--\n\nMoE expert load of one "
     "layer."},
    {"admission_rejected", TM_FASTCALL(Client_admission_rejected),
     "admission_rejected($self, reason, rid=None, t_ns=0)\n--\n\nThe server "
     "refused a request before it entered the engine."},
    {"kv_transfer", TM_FASTCALL(Client_kv_transfer),
     "kv_transfer($self, rid, role, start_ns, t_ns=0, bytes=None, blocks=None, "
     "ok=True, reason=None, connector=None)\n--\n\nOne KV-cache transfer "
     "ended."},
    {"sleep_state", TM_FASTCALL(Client_sleep_state),
     "sleep_state($self, scheduler=None, weights=None, kv_cache=None, "
     "t_ns=0)\n--\n\nThe engine's sleep state changed."},
    {"request_summary", TM_FASTCALL(Client_request_summary),
     "request_summary($self, reason, *, prompt_tokens, generation_tokens, "
     "cached_tokens=None, max_tokens=None, n=None, ttft_ns=None, "
     "queue_ns=None, prefill_ns=None, decode_ns=None, inference_ns=None, "
     "e2e_ns=None, tpot_ns=None, rid=None, t_ns=0, "
     "max_generation_tokens=None)\n--\n\nOne finished request as the "
     "engine computed it."},
    {"latencies", TM_FASTCALL(Client_latencies),
     "latencies($self, ttft_ns=(), itl_ns=(), t_ns=0, *, prompt_tokens=None, "
     "generation_tokens=None, preemptions=None)\n--\n\nOne iteration's "
     "computed latencies and counts."},
    {NULL, NULL, 0, NULL},
};
#undef TM_FASTCALL

static PyGetSetDef Client_getset[] = {
    {"closed", (getter)Client_get_closed, NULL, "True once closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tokenmeter._native.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The hot calls of tokenmeter.Client, in C.",
    .tp_weaklistoffset = offsetof(ClientObject, weakrefs),
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
    .tp_new = PyType_GenericNew,
};

/* ---- module --------------------------------------------------------------
 */

static PyObject* Native_version(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  return PyUnicode_FromString(tm_version());
}

static PyObject* Native_strerror(PyObject* m, PyObject* a) {
  (void)m;
  long rc = PyLong_AsLong(a);
  if (rc == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(tm_strerror((int)rc));
}

static PyObject* Native_now_ns(PyObject* m, PyObject* unused) {
  (void)m;
  (void)unused;
  return PyLong_FromUnsignedLongLong(tm_now_ns());
}

/* close_handle(address): tm_client_close() for the finalizer. */
static PyObject* Native_close_handle(PyObject* m, PyObject* a) {
  (void)m;
  tm_client* h = PyLong_AsVoidPtr(a);
  if (h == NULL) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  Py_BEGIN_ALLOW_THREADS tm_client_close(h, NULL, 0);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyMethodDef Native_methods[] = {
    {"version", Native_version, METH_NOARGS, "libtokenmeter's version."},
    {"strerror", Native_strerror, METH_O, "tm_strerror()."},
    {"now_ns", Native_now_ns, METH_NOARGS, "tm_now_ns()."},
    {"close_handle", Native_close_handle, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tokenmeter._native",
    .m_doc = "libtokenmeter's hot calls as a CPython extension.",
    .m_size = -1,
    .m_methods = Native_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
  if (InternAll() != 0) return NULL;
  if (PyType_Ready(&OptionsType) < 0 || PyType_Ready(&ClientType) < 0) {
    return NULL;
  }
  PyObject* m = PyModule_Create(&native_module);
  if (m == NULL) return NULL;
  Py_INCREF(&OptionsType);
  Py_INCREF(&ClientType);
  if (PyModule_AddObject(m, "Options", (PyObject*)&OptionsType) < 0 ||
      PyModule_AddObject(m, "Client", (PyObject*)&ClientType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
