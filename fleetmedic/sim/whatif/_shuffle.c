/* The replayed scheduler's shuffle (fleetmedic/sim/whatif/world.py, shuffle()), its inner loop.
 *
 * A what-if replay of a 20,000-node fleet shuffles the free nodes at each placement that cannot put
 * every pod back where it ran: tens of thousands of shuffles of ~20,000 nodes in a year of history.
 * A shuffle of 20,000 nodes costs about 2.7 ms with the Python loop, 0.25 ms with this one (the
 * words drawn included; a loaded 2-core VM). It draws the same permutation
 * from the same words as the Python loop (tests/sim/test_whatif.py compares both with
 * random.shuffle): for each i from `top` down, words of `buf` from `p` on, shifted to the bit length
 * of i + 1, until one is below i + 1; then x[i] and x[j] are swapped. When the words run out while
 * drawing for some i, it returns that i so that the caller draws a fresh batch and goes on from it
 * (the words already taken for that i are not used, as in the Python loop).
 *
 * It only moves the list's items: no reference is created or released, and every index is checked
 * against the list's size first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

PyDoc_STRVAR(run_doc,
"run(x, buf, p, top) -> (top, p, done)\n"
"\n"
"x: a list; buf: a buffer of 32-bit unsigned words (array('I')); p: the next word; top: the\n"
"highest index still to draw for. done: every index drawn for; else `top` is the index whose\n"
"draw ran out of words (the caller draws a fresh batch and calls again with p = 0).");

static int bit_length(Py_ssize_t v) {
    int k = 0;
    while (v > 0) {
        k++;
        v >>= 1;
    }
    return k;
}

static PyObject *run(PyObject *self, PyObject *args) {
    PyObject *x;
    Py_buffer view;
    Py_ssize_t p, top;
    if (!PyArg_ParseTuple(args, "O!y*nn", &PyList_Type, &x, &view, &p, &top)) return NULL;
    if (view.len % 4 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "buf is not 32-bit words");
        return NULL;
    }
    if (top >= PyList_GET_SIZE(x) || p < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_IndexError, "top or p out of range");
        return NULL;
    }
    const uint32_t *words = (const uint32_t *)view.buf;
    Py_ssize_t n = view.len / 4;
    PyObject **items = ((PyListObject *)x)->ob_item;
    int done = 1;
    while (top >= 1) {
        int k = bit_length(top + 1);
        Py_ssize_t lo = ((Py_ssize_t)1 << (k - 1)) - 1;
        if (lo < 1) lo = 1;
        int shift = 32 - k;
        Py_ssize_t i;
        for (i = top; i >= lo; i--) {
            Py_ssize_t b = i + 1;
            if (p >= n) goto out_of_words;
            Py_ssize_t j = (Py_ssize_t)(words[p++] >> shift);
            while (j >= b) {
                if (p >= n) goto out_of_words;
                j = (Py_ssize_t)(words[p++] >> shift);
            }
            PyObject *t = items[i];
            items[i] = items[j];
            items[j] = t;
        }
        top = lo - 1;
        continue;
    out_of_words:
        top = i;
        done = 0;
        break;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("nnO", top, p, done ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shuffle", "The replayed scheduler's shuffle, its inner loop (see world.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__shuffle(void) { return PyModule_Create(&module); }
