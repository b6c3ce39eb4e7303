/* The GPU detector's per-batch arithmetic in C: its signals (signals_at) and one step of its
 * per-signal baselines (step_baselines_at), in place on the detector's slab.
 *
 * signals_at is gpu_signals.compute_signals plus the update of each node's watched values that
 * follows it: residuals of the gauges against their node's median, rates per minute of the
 * counters (NaN over a reset, a gap or a counter that went down), summed per signal in numpy's
 * order; then each watched value that was reported replaces the node's previous one.
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

/* whether the buffer's items are one of the struct codes in `codes` (native order) */
static int format_is(const Py_buffer *view, const char *codes) {
    const char *format = view->format != NULL ? view->format : "B";
    if ((format[0] == '<' || format[0] == '=' || format[0] == '@') && format[1] != '\0') format++;
    return strlen(format) == 1 && strchr(codes, format[0]) != NULL;
}

/* the buffer of `obj` as C-contiguous `count` items (any number if count < 0) of one of `formats`
 * ("d", "q/l", "?/B") */
static int get_buf(PyObject *obj, Buf *buf, const char *name, const char *formats, Py_ssize_t itemsize,
                   Py_ssize_t count, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &buf->view, flags) < 0) return -1;
    buf->held = 1;
    if (!format_is(&buf->view, formats) || buf->view.itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: not a buffer of %s", name, formats);
        return -1;
    }
    if (count < 0 ? buf->view.len % itemsize != 0 : buf->view.len != count * itemsize) {
        if (count < 0)
            PyErr_Format(PyExc_ValueError, "%s: %zd bytes, not whole items of %zd bytes", name, buf->view.len,
                         itemsize);
        else
            PyErr_Format(PyExc_ValueError, "%s: %zd bytes where %zd items of %zd bytes were expected", name,
                         buf->view.len, count, itemsize);
        return -1;
    }
    return 0;
}

/* a * b * c items of 8 bytes, times 8 (the flags of four arrays), fit a Py_ssize_t */
static int sizes_fit(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    const Py_ssize_t limit = PY_SSIZE_T_MAX / 64;
    if (a < 0 || b < 0 || c < 0 || a > limit || b > limit || c > limit) return 0;
    if (b > 0 && c > limit / b) return 0;
    return b * c == 0 || a <= limit / (b * c);
}

/* the buffers held released; None if `ok`, else NULL (the error is set) */
static PyObject *release(Buf *bufs, int n, int ok) {
    for (int k = 0; k < n; k++)
        if (bufs[k].held) PyBuffer_Release(&bufs[k].view);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* idx: `n` rows of a `rows`-row array, each in range and none twice (a row is updated in place,
 * and numpy's gather-compute-scatter would see each row's state before the call) */
static int check_rows(const int64_t *idx, Py_ssize_t n, Py_ssize_t rows, const char *what) {
    unsigned char *seen = PyMem_Calloc(rows > 0 ? (size_t)rows : 1, 1);
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        if (idx[i] < 0 || idx[i] >= rows) {
            PyErr_Format(PyExc_IndexError, "idx[%zd] = %lld is not a row of %s (%zd rows)", i, (long long)idx[i],
                         what, rows);
            failed = 1;
        } else if (seen[idx[i]]++) {
            PyErr_Format(PyExc_ValueError, "idx[%zd] = %lld: a row twice in one call", i, (long long)idx[i]);
            failed = 1;
        }
    }
    PyMem_Free(seen);
    return failed ? -1 : 0;
}

/* a float64 array of `ndim` dimensions of the given shape, any strides (read only) */
static int get_strided(PyObject *obj, Buf *buf, const char *name, int ndim, const Py_ssize_t *shape) {
    if (PyObject_GetBuffer(obj, &buf->view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
    buf->held = 1;
    if (!format_is(&buf->view, "d") || buf->view.itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: not a float64 buffer", name);
        return -1;
    }
    if (buf->view.ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions where %d were expected", name, buf->view.ndim, ndim);
        return -1;
    }
    for (int d = 0; d < ndim; d++)
        if (buf->view.shape[d] != shape[d]) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d is %zd, not %zd", name, d, buf->view.shape[d], shape[d]);
            return -1;
        }
    return 0;
}

#define AT2(b, i, j) (*(const double *)((const char *)(b).view.buf + (i) * (b).view.strides[0] + \
                                        (j) * (b).view.strides[1]))
#define AT3(b, i, j, k) (*(const double *)((const char *)(b).view.buf + (i) * (b).view.strides[0] + \
                                           (j) * (b).view.strides[1] + (k) * (b).view.strides[2]))

PyDoc_STRVAR(signals_doc,
"signals_at(shape, rows, x, prev, idx, dt, reset, medians, residual_rows, watched_rows, group_starts,\n"
"           group_members, max_gap_s, out)\n"
"\n"
"shape: (B, M, G, S, W); x: float64 [B, M, G], any strides; prev: writable float64 [rows, W, G], the\n"
"slab's watched values; idx: int64 [B], distinct rows of prev; dt: float64 [B]; reset: bool [B];\n"
"medians: float64 [B, R], any strides; residual_rows: int64 [R] (rows of x); watched_rows: int64 [W]\n"
"(rows of x); group_starts: int64 [S - R + 1], group_members: int64 [K] (watched indices summed per\n"
"rate signal); out: writable float64 [B, S, G]. All but x and medians C-contiguous. Writes the\n"
"signals into out and the reported watched values of x into prev[idx].");

static PyObject *signals_at(PyObject *self, PyObject *args) {
    PyObject *o_x, *o_prev, *o_idx, *o_dt, *o_reset, *o_med, *o_res, *o_watch, *o_starts, *o_members, *o_out;
    Py_ssize_t b_n, m_n, g_n, s_n, w_n, rows;
    double max_gap;
    if (!PyArg_ParseTuple(args, "(nnnnn)nOOOOOOOOOOdO:signals_at", &b_n, &m_n, &g_n, &s_n, &w_n, &rows, &o_x,
                          &o_prev, &o_idx, &o_dt, &o_reset, &o_med, &o_res, &o_watch, &o_starts, &o_members,
                          &max_gap, &o_out))
        return NULL;
    if (!sizes_fit(b_n, m_n, g_n) || !sizes_fit(b_n, s_n, g_n) || !sizes_fit(rows, w_n, g_n)) {
        PyErr_SetString(PyExc_ValueError, "shape out of range");
        return NULL;
    }
    enum { X, PREV, IDX, DT, RESET, MED, RES, WATCH, STARTS, MEMBERS, OUT, NBUF };
    Buf bufs[NBUF];
    memset(bufs, 0, sizeof(bufs));
    int ok = 0;
    const Py_ssize_t x_shape[3] = {b_n, m_n, g_n};
    if (get_strided(o_x, &bufs[X], "x", 3, x_shape) < 0) goto done;
    /* the residual count R and the count of group members come from their own buffers */
    if (get_buf(o_res, &bufs[RES], "residual_rows", "ql", 8, -1, 0) < 0) goto done;
    Py_ssize_t r_n = bufs[RES].view.len / 8;
    if (get_buf(o_members, &bufs[MEMBERS], "group_members", "ql", 8, -1, 0) < 0) goto done;
    Py_ssize_t k_n = bufs[MEMBERS].view.len / 8;
    if (r_n > s_n) {
        PyErr_SetString(PyExc_ValueError, "more residual signals than signals");
        goto done;
    }
    const Py_ssize_t med_shape[2] = {b_n, r_n};
    if (get_strided(o_med, &bufs[MED], "medians", 2, med_shape) < 0) goto done;
    struct {
        PyObject *obj;
        int k;
        const char *name, *formats;
        Py_ssize_t itemsize, count;
        int writable;
    } spec[] = {
        {o_prev, PREV, "prev", "d", 8, rows * w_n * g_n, 1},
        {o_idx, IDX, "idx", "ql", 8, b_n, 0},
        {o_dt, DT, "dt", "d", 8, b_n, 0},
        {o_reset, RESET, "reset", "?B", 1, b_n, 0},
        {o_watch, WATCH, "watched_rows", "ql", 8, w_n, 0},
        {o_starts, STARTS, "group_starts", "ql", 8, s_n - r_n + 1, 0},
        {o_out, OUT, "out", "d", 8, b_n * s_n * g_n, 1},
    };
    for (size_t k = 0; k < sizeof(spec) / sizeof(spec[0]); k++)
        if (get_buf(spec[k].obj, &bufs[spec[k].k], spec[k].name, spec[k].formats, spec[k].itemsize, spec[k].count,
                    spec[k].writable) < 0)
            goto done;
    const int64_t *idx = bufs[IDX].view.buf, *res = bufs[RES].view.buf, *watch = bufs[WATCH].view.buf,
                  *starts = bufs[STARTS].view.buf, *members = bufs[MEMBERS].view.buf;
    for (Py_ssize_t r = 0; r < r_n; r++)
        if (res[r] < 0 || res[r] >= m_n) {
            PyErr_Format(PyExc_IndexError, "residual_rows[%zd] is not a row of x", r);
            goto done;
        }
    for (Py_ssize_t w = 0; w < w_n; w++)
        if (watch[w] < 0 || watch[w] >= m_n) {
            PyErr_Format(PyExc_IndexError, "watched_rows[%zd] is not a row of x", w);
            goto done;
        }
    if (starts[0] != 0 || starts[s_n - r_n] != k_n) {
        PyErr_SetString(PyExc_ValueError, "group_starts do not span group_members");
        goto done;
    }
    for (Py_ssize_t j = 0; j < s_n - r_n; j++)
        if (starts[j + 1] < starts[j]) {
            PyErr_SetString(PyExc_ValueError, "group_starts go down");
            goto done;
        }
    for (Py_ssize_t k = 0; k < k_n; k++)
        if (members[k] < 0 || members[k] >= w_n) {
            PyErr_Format(PyExc_IndexError, "group_members[%zd] is not a watched value", k);
            goto done;
        }
    if (check_rows(idx, b_n, rows, "prev") < 0) goto done;
    const double *dt = bufs[DT].view.buf;
    const unsigned char *reset = bufs[RESET].view.buf;
    double *prev = bufs[PREV].view.buf, *out = bufs[OUT].view.buf;
    for (Py_ssize_t i = 0; i < b_n; i++) {
        double *p = prev + idx[i] * w_n * g_n, *o = out + i * s_n * g_n;
        for (Py_ssize_t r = 0; r < r_n; r++) {
            const double centre = AT2(bufs[MED], i, r);
            for (Py_ssize_t g = 0; g < g_n; g++) o[r * g_n + g] = AT3(bufs[X], i, res[r], g) - centre;
        }
        const int rated = !reset[i] && dt[i] > 0 && dt[i] <= max_gap;
        const double per_min = 60.0 / (dt[i] > 0 ? dt[i] : 1.0);
        for (Py_ssize_t j = 0; j < s_n - r_n; j++) {
            for (Py_ssize_t g = 0; g < g_n; g++) {
                /* the sum of the counters present; one that went down, a reset or a gap: no rate */
                double sum = 0.0;
                int present = 0, down = 0;
                for (int64_t k = starts[j]; k < starts[j + 1]; k++) {
                    const double rate = (AT3(bufs[X], i, watch[members[k]], g) - p[members[k] * g_n + g]) * per_min;
                    if (isnan(rate)) continue;
                    present = 1;
                    if (rate < 0) down = 1;
                    sum += rate; /* numpy's order: from 0, each in turn */
                }
                o[(r_n + j) * g_n + g] = (rated && present && !down) ? sum : NAN;
            }
        }
        for (Py_ssize_t w = 0; w < w_n; w++)
            for (Py_ssize_t g = 0; g < g_n; g++) {
                const double v = AT3(bufs[X], i, watch[w], g);
                if (isfinite(v)) p[w * g_n + g] = v;
            }
    }
    ok = 1;
done:
    return release(bufs, NBUF, ok);
}

static PyObject *step_baselines_at(PyObject *self, PyObject *args) {
    PyObject *o_y, *o_planes, *o_idx, *o_sign, *o_zw, *o_zc, *o_md, *o_floor, *o_z, *o_dev, *o_base, *o_flags;
    double alpha, warmup, min_std, protect_z, continuity, cusum_k, cusum_h;
    Py_ssize_t b_n, s_n, g_n, rows;
    if (!PyArg_ParseTuple(args, "(nnn)nOOOOOOOOdddddddOOOO:step_baselines_at", &b_n, &s_n, &g_n, &rows, &o_y,
                          &o_planes, &o_idx, &o_sign, &o_zw, &o_zc, &o_md, &o_floor, &alpha, &warmup, &min_std,
                          &protect_z, &continuity, &cusum_k, &cusum_h, &o_z, &o_dev, &o_base, &o_flags))
        return NULL;
    if (!sizes_fit(b_n, s_n, g_n) || !sizes_fit(rows, PLANES * s_n, g_n)) {
        PyErr_SetString(PyExc_ValueError, "shape out of range");
        return NULL;
    }
    Py_ssize_t cell = s_n * g_n, n = b_n * cell;
    enum { Y, PL, IDX, SIGN, ZW, ZC, MD, FLOOR, Z, DEV, BASE, FLAGS, NBUF };
    Buf bufs[NBUF];
    memset(bufs, 0, sizeof(bufs));
    int ok = 0;
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
    if (check_rows(idx, b_n, rows, "planes") < 0) goto done;
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
            const double sg = sign[s], std_min = max_nan(min_std, floor_[s]);
            const int both = sg == 0;
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
    ok = 1;
done:
    return release(bufs, NBUF, ok);
}

static PyMethodDef methods[] = {
    {"signals_at", signals_at, METH_VARARGS, signals_doc},
    {"step_baselines_at", step_baselines_at, METH_VARARGS, step_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_baselines",
    "The GPU detector's signals and baseline step, natively (see gpu_signals).", -1, methods,
};

PyMODINIT_FUNC PyInit__baselines(void) { return PyModule_Create(&module); }
