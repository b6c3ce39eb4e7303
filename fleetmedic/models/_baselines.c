/* One step of the GPU detector's per-signal baselines, in place on the detector's slab.
 *
 * gpu_signals.step_baselines scores a micro-batch of signals y [B, S, G] against each GPU's
 * baseline (EWMA mean and variance, two CUSUMs, a streak counter: six planes [K, S, G] per node)
 * and learns from it. In numpy that is ~40 whole-array operations over [256, 10, 8] arrays, most
 * of them making a temporary; here it is one pass over the elements, reading and writing the
 * slab's rows in place (no gather and scatter of the rows either).
 *
 * The arithmetic is the numpy function's, operation for operation and in the same order, so each
 * result equals it (tests/models/test_native_baselines.py): every float is equal (NaN where numpy
 * gives NaN), every flag the same. The only freedom is the sign of a zero where numpy itself has
 * none to give: np.maximum / np.minimum of +0.0 and -0.0 returns either, depending on whether
 * numpy's SIMD or scalar loop ran; such zeros compare equal. np.maximum / np.minimum propagate
 * NaN (max_nan / min_nan below); np.clip does too, and NaN is then counted 0.
 * Build without FMA contraction (setup.py: -ffp-contract=off): a fused a * b + c rounds once,
 * numpy rounds twice.
 *
 * Every buffer's type and size, every row index and their distinctness are checked before the
 * first write, so a refused call (TypeError, ValueError, IndexError) has changed nothing and the
 * caller can run the numpy path instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { COUNT, MEAN, VAR, CUSUM_UP, CUSUM_DOWN, STREAK, PLANES };

PyDoc_STRVAR(step_doc,
"step_baselines_at(y, planes, idx, sign, z_warning, z_critical, min_delta, std_floor, alpha, warmup,\n"
"                  min_std, protect_z, continuity, cusum_k, cusum_h, z, deviation, baseline, flags)\n"
"\n"
"y: float64 [B, S, G]; planes: writable float64 [N, 6, S, G], the slab; idx: int64 [B], distinct\n"
"rows of planes; sign, z_warning, z_critical, min_delta, std_floor: float64 [S]; z, deviation,\n"
"baseline: writable float64 [B, S, G]; flags: writable bool [4, B, S, G] (exceeded, critical,\n"
"persistent, drifting). All C-contiguous. Updates planes[idx] in place.");

/* numpy's maximum / minimum: NaN if either is NaN */
static inline double max_nan(double a, double b) { return (a >= b || isnan(a)) ? a : b; }
static inline double min_nan(double a, double b) { return (a <= b || isnan(a)) ? a : b; }

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* the buffer of `obj` as C-contiguous `count` items of one of `formats` ("d", "q/l", "?/B") */
static int get_buf(PyObject *obj, Buf *buf, const char *name, const char *formats, Py_ssize_t itemsize,
                   Py_ssize_t count, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &buf->view, flags) < 0) return -1;
    buf->held = 1;
    const char *format = buf->view.format != NULL ? buf->view.format : "B";
    if ((format[0] == '<' || format[0] == '=' || format[0] == '@') && format[1] != '\0') format++;
    if (strlen(format) != 1 || strchr(formats, format[0]) == NULL || buf->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: not a buffer of %s", name, formats);
        return -1;
    }
    if (count < 0 || buf->view.len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes where %zd items of %zd bytes were expected", name,
                     buf->view.len, count, itemsize);
        return -1;
    }
    return 0;
}

static PyObject *step_baselines_at(PyObject *self, PyObject *args) {
    PyObject *o_y, *o_planes, *o_idx, *o_sign, *o_zw, *o_zc, *o_md, *o_floor, *o_z, *o_dev, *o_base, *o_flags;
    double alpha, warmup, min_std, protect_z, continuity, cusum_k, cusum_h;
    Py_ssize_t b_n, s_n, g_n, rows;
    if (!PyArg_ParseTuple(args, "(nnn)nOOOOOOOOdddddddOOOO:step_baselines_at", &b_n, &s_n, &g_n, &rows, &o_y,
                          &o_planes, &o_idx, &o_sign, &o_zw, &o_zc, &o_md, &o_floor, &alpha, &warmup, &min_std,
                          &protect_z, &continuity, &cusum_k, &cusum_h, &o_z, &o_dev, &o_base, &o_flags))
        return NULL;
    if (b_n < 0 || s_n < 0 || g_n < 0 || rows < 0 || (s_n > 0 && g_n > 0 && (b_n > PY_SSIZE_T_MAX / 64 / s_n / g_n ||
                                                                             rows > PY_SSIZE_T_MAX / 64 / s_n / g_n))) {
        PyErr_SetString(PyExc_ValueError, "shape out of range");
        return NULL;
    }
    Py_ssize_t cell = s_n * g_n, n = b_n * cell;
    enum { Y, PL, IDX, SIGN, ZW, ZC, MD, FLOOR, Z, DEV, BASE, FLAGS, NBUF };
    Buf bufs[NBUF];
    memset(bufs, 0, sizeof(bufs));
    unsigned char *seen = NULL;
    PyObject *result = NULL;
    struct {
        PyObject *obj;
        const char *name, *formats;
        Py_ssize_t itemsize, count;
        int writable;
    } spec[NBUF] = {
        {o_y, "y", "d", 8, n, 0},
        {o_planes, "planes", "d", 8, rows * PLANES * cell, 1},
        {o_idx, "idx", "ql", 8, b_n, 0},
        {o_sign, "sign", "d", 8, s_n, 0},
        {o_zw, "z_warning", "d", 8, s_n, 0},
        {o_zc, "z_critical", "d", 8, s_n, 0},
        {o_md, "min_delta", "d", 8, s_n, 0},
        {o_floor, "std_floor", "d", 8, s_n, 0},
        {o_z, "z", "d", 8, n, 1},
        {o_dev, "deviation", "d", 8, n, 1},
        {o_base, "baseline", "d", 8, n, 1},
        {o_flags, "flags", "?B", 1, 4 * n, 1},
    };
    for (int k = 0; k < NBUF; k++)
        if (get_buf(spec[k].obj, &bufs[k], spec[k].name, spec[k].formats, spec[k].itemsize, spec[k].count,
                    spec[k].writable) < 0)
            goto done;
    const int64_t *idx = (const int64_t *)bufs[IDX].view.buf;
    seen = PyMem_Calloc(rows > 0 ? (size_t)rows : 1, 1);
    if (seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < b_n; i++) {
        if (idx[i] < 0 || idx[i] >= rows) {
            PyErr_Format(PyExc_IndexError, "idx[%zd] = %lld is not a row of planes (%zd rows)", i, (long long)idx[i],
                         rows);
            goto done;
        }
        if (seen[idx[i]]++) {
            PyErr_Format(PyExc_ValueError, "idx[%zd] = %lld: a row twice in one step", i, (long long)idx[i]);
            goto done;
        }
    }
    const double *y = bufs[Y].view.buf, *sign = bufs[SIGN].view.buf, *zw = bufs[ZW].view.buf,
                 *zcrit = bufs[ZC].view.buf, *md = bufs[MD].view.buf, *floor_ = bufs[FLOOR].view.buf;
    double *planes = bufs[PL].view.buf, *z_out = bufs[Z].view.buf, *dev_out = bufs[DEV].view.buf,
           *base_out = bufs[BASE].view.buf;
    unsigned char *exceeded_out = bufs[FLAGS].view.buf, *critical_out = exceeded_out + n,
                  *persistent_out = critical_out + n, *drifting_out = persistent_out + n;
    const double cap = 2 * cusum_h;
    for (Py_ssize_t i = 0; i < b_n; i++) {
        double *p = planes + idx[i] * PLANES * cell;
        for (Py_ssize_t s = 0; s < s_n; s++) {
            const double sg = sign[s], both = sg == 0, std_min = max_nan(min_std, floor_[s]);
            for (Py_ssize_t g = 0; g < g_n; g++) {
                const Py_ssize_t at = s * g_n + g, o = i * cell + at;
                double *count = p + COUNT * cell + at, *mean = p + MEAN * cell + at, *var = p + VAR * cell + at,
                       *up_p = p + CUSUM_UP * cell + at, *down_p = p + CUSUM_DOWN * cell + at,
                       *streak = p + STREAK * cell + at;
                const double v = y[o], m = *mean, va = *var, c = *count;
                const double std = max_nan(sqrt(va), std_min);
                const double raw = v - m;
                const int warm = c >= warmup, finite = isfinite(v);
                const double q = raw / std, aq = fabs(q), absraw = fabs(raw);
                const double signed_ = both ? absraw : raw * sg;
                const double z = (warm && finite) ? (both ? aq : q * sg) : NAN;
                const int exceeded = (z >= zw[s]) && (signed_ >= md[s]);
                const int critical = exceeded && (z >= zcrit[s]);
                const int protect = warm && (aq > protect_z);
                const double st = exceeded ? *streak + 1 : (finite ? 0.0 : *streak);
                double zc = isnan(q) ? 0.0 : (q < -protect_z ? -protect_z : (q > protect_z ? protect_z : q));
                const int big = absraw >= md[s];
                const double up = warm ? max_nan(0.0, *up_p + (big ? zc : min_nan(zc, 0.0)) - cusum_k) : 0.0;
                const double down = warm ? max_nan(0.0, *down_p - (big ? zc : max_nan(zc, 0.0)) - cusum_k) : 0.0;
                const int take = finite && !protect, first = take && c == 0;
                const double a = first ? 1.0 : (take ? alpha : 0.0), d = take ? raw : 0.0;
                base_out[o] = m;
                z_out[o] = z;
                dev_out[o] = signed_;
                exceeded_out[o] = (unsigned char)exceeded;
                critical_out[o] = (unsigned char)critical;
                persistent_out[o] = st >= continuity;
                drifting_out[o] = (sg >= 0 && up > cusum_h) || (sg <= 0 && down > cusum_h);
                *streak = st;
                *up_p = min_nan(up, cap);
                *down_p = min_nan(down, cap);
                *mean = m + a * d;
                *var = first ? 0.0 : (1.0 - a) * (va + a * d * d);
                *count = c + (take ? 1.0 : 0.0);
            }
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(seen);
    for (int k = 0; k < NBUF; k++)
        if (bufs[k].held) PyBuffer_Release(&bufs[k].view);
    return result;
}

static PyMethodDef methods[] = {
    {"step_baselines_at", step_baselines_at, METH_VARARGS, step_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_baselines",
    "The GPU detector's baseline step, natively (see gpu_signals.step_baselines).", -1, methods,
};

PyMODINIT_FUNC PyInit__baselines(void) { return PyModule_Create(&module); }
