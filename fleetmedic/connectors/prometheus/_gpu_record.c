/* The columns of a GpuTelemetry record in C: the common case of ExpositionReader.gpu_record
 * (fleetmedic/connectors/prometheus/text.py), which every exposition path shares (text, OpenMetrics,
 * range queries, remote write).
 *
 * common_columns(per_gpu, checks) -> (columns, rest)
 *   per_gpu: one dict per GPU (in ``gpus`` order) of metric -> value, as the readers hold them;
 *   checks: metric -> (integral, lowest, highest, series), prometheus/text.py's _GPU_CHECKS.
 *   columns: metric -> the column, for each metric in ``checks`` that every GPU reported as a float
 *   within [lowest, highest] (ints made of them by truncation where the metric is integral, as
 *   Python's int() does; otherwise the very float objects). rest: every other metric in ``checks``
 *   that some GPU reported (a GPU without it, a value out of range or not finite, a value that is not
 *   a float), left to gpu_record's Python loop, which counts the reasons and keeps what is good.
 *   Keys not in ``checks`` are ignored, as gpu_record ignores them.
 *
 * In Python the column loop costs about 5 us a metric (8 GPUs); here about a tenth.
 * tests/connectors/prometheus/test_gpu_record_equivalence.py holds the two to the same records and counts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* the column of ``metric`` when it is the common case: a new list; NULL with no exception set when
   it is not; NULL with an exception set on error */
static PyObject *column(PyObject *per_gpu, PyObject *metric, PyObject *check) {
    if (!PyTuple_CheckExact(check) || PyTuple_GET_SIZE(check) < 3) return NULL;
    int integral = PyObject_IsTrue(PyTuple_GET_ITEM(check, 0));
    if (integral < 0) return NULL;
    double lo = PyFloat_AsDouble(PyTuple_GET_ITEM(check, 1));
    if (lo == -1.0 && PyErr_Occurred()) return NULL;
    double top = PyFloat_AsDouble(PyTuple_GET_ITEM(check, 2));
    if (top == -1.0 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(per_gpu);
    PyObject *col = PyList_New(n);
    if (col == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(per_gpu, i);
        PyObject *v = PyDict_GetItemWithError(row, metric);
        if (v == NULL || !PyFloat_CheckExact(v)) goto not_common;
        double x = PyFloat_AS_DOUBLE(v);
        if (!(lo <= x && x <= top) || !isfinite(x)) goto not_common;
        PyObject *item;
        if (integral) {
            item = PyLong_FromDouble(x);
            if (item == NULL) goto error;
        } else {
            item = Py_NewRef(v);
        }
        PyList_SET_ITEM(col, i, item);
    }
    return col;
not_common:
    Py_DECREF(col);
    return NULL;  /* with an exception set only if the lookup failed */
error:
    Py_DECREF(col);
    return NULL;
}

PyDoc_STRVAR(common_columns_doc,
"common_columns(per_gpu, checks) -> (columns, rest)\n"
"\n"
"The columns of the metrics every GPU reported within range, and the metrics left to the Python\n"
"loop. See _gpu_record.c.");

static PyObject *common_columns(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *per_gpu, *checks;
    if (!PyArg_ParseTuple(args, "O!O!:common_columns", &PyList_Type, &per_gpu, &PyDict_Type, &checks))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(per_gpu);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyDict_Check(PyList_GET_ITEM(per_gpu, i))) {
            PyErr_SetString(PyExc_TypeError, "common_columns: per_gpu holds a non-dict");
            return NULL;
        }
    }
    PyObject *columns = PyDict_New(), *rest = PyList_New(0), *seen = PyDict_New();
    if (columns == NULL || rest == NULL || seen == NULL) goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(per_gpu, i), *metric, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(row, &pos, &metric, &value)) {
            int done = PyDict_Contains(seen, metric);
            if (done < 0) goto error;
            if (done) continue;
            if (PyDict_SetItem(seen, metric, Py_None) < 0) goto error;
            PyObject *check = PyDict_GetItemWithError(checks, metric);
            if (check == NULL) {
                if (PyErr_Occurred()) goto error;
                continue;  /* not a GPU metric: gpu_record does not read it */
            }
            Py_INCREF(check);  /* held across calls that may run Python code (__eq__ of an odd key) */
            PyObject *col = column(per_gpu, metric, check);
            Py_DECREF(check);
            if (col == NULL) {
                if (PyErr_Occurred()) goto error;
                if (PyList_Append(rest, metric) < 0) goto error;
                continue;
            }
            int rc = PyDict_SetItem(columns, metric, col);
            Py_DECREF(col);
            if (rc < 0) goto error;
        }
    }
    Py_DECREF(seen);
    return Py_BuildValue("(NN)", columns, rest);
error:
    Py_XDECREF(columns);
    Py_XDECREF(rest);
    Py_XDECREF(seen);
    return NULL;
}

static PyMethodDef methods[] = {
    {"common_columns", common_columns, METH_VARARGS, common_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gpu_record",
    "The common columns of a GpuTelemetry record in C (see _gpu_record.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gpu_record(void) { return PyModule_Create(&module); }
