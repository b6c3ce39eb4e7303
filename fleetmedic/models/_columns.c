/* The metric columns of a micro-batch of telemetry, from Python lists into one float64 array.
 *
 * Stage 1 of the detect worker turns every message's metric lists (8 GPUs x 22 metrics: 176 Python
 * numbers) into a [messages, metrics, GPUs] array. In Python the fastest way found
 * (struct.pack_into, see sample_columns.py) costs about 4 us per message, a seventh of stage 1;
 * this loop does the same in about 0.7 us. It only reads: borrowed references, no Python object
 * is created except on error, and every size is checked before it is used.
 *
 * The result equals the Python path's bit for bit (tests/models/test_native_columns.py):
 *   - a float is copied; an int is converted as float(int) would (correctly rounded, so exact
 *     below 2**53), which is also what numpy's int64 -> float64 cast gives;
 *   - None for one value (a GPU that did not report it), or for a whole column (a metric no GPU
 *     reported), is NaN.
 * Anything else (a column that is not a list of exactly `gpus` values, a value that is neither a
 * float, an int nor None, an int beyond a double) raises TypeError, ValueError or OverflowError,
 * and the caller falls back to the Python path. Decoded telemetry never gets there: its schema
 * and its length check (records.DetectionTelemetry) rule those out.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

PyDoc_STRVAR(columns_into_doc,
"columns_into(rows, picks, gpus, out)\n"
"\n"
"rows: list of tuples (each message's metric columns, astuple of its metrics); picks: tuple of\n"
"column indices into each row; gpus: values per column; out: a writable C-contiguous float64\n"
"buffer of len(rows) * len(picks) * gpus, filled as [rows, picks, gpus] (None -> NaN).");

static int fill_column(PyObject *column, Py_ssize_t gpus, double *dst) {
    if (column == Py_None) {
        for (Py_ssize_t v = 0; v < gpus; v++) dst[v] = NAN;
        return 0;
    }
    if (!PyList_CheckExact(column)) {
        PyErr_SetString(PyExc_TypeError, "a metric column is not a list");
        return -1;
    }
    if (PyList_GET_SIZE(column) != gpus) {
        PyErr_Format(PyExc_ValueError, "a metric column has %zd values for %zd GPUs", PyList_GET_SIZE(column), gpus);
        return -1;
    }
    for (Py_ssize_t v = 0; v < gpus; v++) {
        PyObject *x = PyList_GET_ITEM(column, v);
        if (PyFloat_CheckExact(x)) {
            dst[v] = PyFloat_AS_DOUBLE(x);
        } else if (PyLong_CheckExact(x)) {
            double d = PyLong_AsDouble(x);
            if (d == -1.0 && PyErr_Occurred()) return -1;
            dst[v] = d;
        } else if (x == Py_None) {
            dst[v] = NAN;
        } else {
            PyErr_SetString(PyExc_TypeError, "a metric value is not a number");
            return -1;
        }
    }
    return 0;
}

static PyObject *columns_into(PyObject *self, PyObject *args) {
    PyObject *rows, *picks, *out;
    Py_ssize_t gpus;
    if (!PyArg_ParseTuple(args, "O!O!nO:columns_into", &PyList_Type, &rows, &PyTuple_Type, &picks, &gpus, &out))
        return NULL;
    if (gpus < 0) {
        PyErr_SetString(PyExc_ValueError, "gpus must be >= 0");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows), k = PyTuple_GET_SIZE(picks);
    /* the picks as C indices, checked once */
    Py_ssize_t *at = PyMem_New(Py_ssize_t, k > 0 ? k : 1);
    if (at == NULL) return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < k; j++) {
        at[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(picks, j));
        if (at[j] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a pick is negative");
            PyMem_Free(at);
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyMem_Free(at);
        return NULL;
    }
    int failed = 0;
    const char *format = view.format != NULL ? view.format : "B";
    if ((format[0] == '<' || format[0] == '=' || format[0] == '@') && format[1] == 'd') format++;
    if (strcmp(format, "d") != 0) {
        PyErr_SetString(PyExc_TypeError, "out is not a float64 buffer");
        failed = 1;
    } else if (gpus != 0 && (n > PY_SSIZE_T_MAX / (k > 0 ? k : 1) / gpus / (Py_ssize_t)sizeof(double) ||
                      view.len != n * k * gpus * (Py_ssize_t)sizeof(double))) {
        PyErr_SetString(PyExc_ValueError, "out is not rows x picks x gpus float64 values");
        failed = 1;
    } else if (gpus == 0 && view.len != 0) {
        PyErr_SetString(PyExc_ValueError, "out is not rows x picks x gpus float64 values");
        failed = 1;
    }
    double *dst = (double *)view.buf;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row)) {
            PyErr_SetString(PyExc_TypeError, "a row is not a tuple");
            failed = 1;
            break;
        }
        for (Py_ssize_t j = 0; j < k; j++, dst += gpus) {
            if (at[j] >= PyTuple_GET_SIZE(row)) {
                PyErr_SetString(PyExc_IndexError, "a pick is beyond a row");
                failed = 1;
                break;
            }
            if (fill_column(PyTuple_GET_ITEM(row, at[j]), gpus, dst) < 0) {
                failed = 1;
                break;
            }
        }
    }
    PyBuffer_Release(&view);
    PyMem_Free(at);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"columns_into", columns_into, METH_VARARGS, columns_into_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns", "Stage 1's metric columns into numpy, natively (see sample_columns.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
