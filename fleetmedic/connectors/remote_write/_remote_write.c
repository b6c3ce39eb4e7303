/* The remote-write receiver's commonest series, held in C (assembler._read's inline case).
 *
 * Prometheus writes each series of a request as its label bytes followed by one sample, and sends
 * the same label sets scrape after scrape. For such a series whose label bytes are a label set the
 * receiver already resolved, whose timestamp this request already decoded, and whose node's open
 * scrape is the one of that timestamp, holding the sample is: find the label set, read the double,
 * store it in the GPU's row of that scrape. In Python that costs about 1.5 us a series; here about
 * a fifth. Everything else (the first series of a node's scrape, a new label set, another layout, a
 * non-finite value...) is handed back to the Python loop, which does the same checks again and takes
 * its general path, so the two give the same result (tests/connectors/remote_write/test_remote_write_equivalence.py
 * runs the property test with and without this module).
 *
 * hold_inline(series, prefixes, stamps) -> (raw or None, held, late, ignored)
 *   series: an iterator of the request's series (bytes); it is advanced until a series this loop
 *   cannot hold, which is returned (None at the end); held: the series held here, late: those of
 *   them whose node's scrape was released already (counted, not held); ignored: series of label
 *   sets fleetmedic does not read (not held, not in ``held``). prefixes: label bytes ->
 *   assembler._LabelSet; stamps: the 7 tail bytes (0x10 and a 6-byte varint) -> seconds.
 *
 * The checks, in the order the Python loop makes them (assembler._read):
 *   - valued: raw[-16] == 0x09, prefixes[raw[:-18]], raw[-18:-15] == 12 10 09, stamps[raw[-7:]];
 *   - else zero-valued: raw[-9:-7] == 12 07, prefixes[raw[:-9]], stamps[raw[-7:]] (value 0.0);
 *   - then: set.node None and set.name None: ignored (a series fleetmedic does not read);
 *     set.node is not None, node.ts == ts, the value finite, set.gpu is not None;
 *     node.rows None: late; else rows[index][target] = value (and node.meta[uuid key] = uuid when
 *     the set carries a uuid); a row rows has not yet is made first, and the uuid of the set's
 *     series written, as Assembler._hold does for a GPU's first value of a scrape.
 * Only borrowed references are kept across calls; the series handed back is a new reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <string.h>

static PyObject *s_node, *s_ts, *s_gpu, *s_rows, *s_meta, *s_name, *s_series, *s_uuid;

/* An attribute of one of the receiver's slotted classes (assembler._LabelSet, _Node), read at
   its slot's offset: about a fifth of PyObject_GetAttr's cost, which was a fifth of this loop's.
   The offset is found once per (type, name) from the class's member descriptor; an attribute that
   is not a plain object slot (a property, a subclass overriding it...) takes PyObject_GetAttr.
   A new reference; NULL with an exception set if it cannot be read. */
#define SLOT_CACHE 16
static struct {
    PyTypeObject *type;  /* a strong reference: its address cannot be reused while cached */
    PyObject *name;      /* an interned name of this module */
    Py_ssize_t offset;   /* -1: not a plain object slot */
} slots[SLOT_CACHE];
static int slots_used;

static Py_ssize_t slot_offset(PyTypeObject *type, PyObject *name) {
    for (int i = 0; i < slots_used; i++)
        if (slots[i].type == type && slots[i].name == name) return slots[i].offset;
    Py_ssize_t offset = -1;
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
    if (descr == NULL) {
        PyErr_Clear();  /* PyObject_GetAttr on the instance says why */
    } else {
        if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
            if (def->type == T_OBJECT_EX && !(def->flags & READONLY)) offset = def->offset;
        }
        Py_DECREF(descr);
    }
    if (slots_used < SLOT_CACHE) {
        Py_INCREF(type);
        slots[slots_used].type = type;
        slots[slots_used].name = name;
        slots[slots_used].offset = offset;
        slots_used++;
    }
    return offset;
}

static PyObject *attr(PyObject *obj, PyObject *name) {
    Py_ssize_t offset = slot_offset(Py_TYPE(obj), name);
    if (offset < 0) return PyObject_GetAttr(obj, name);
    PyObject *value = *(PyObject **)((char *)obj + offset);
    if (value == NULL) return PyObject_GetAttr(obj, name);  /* unset: raises as Python would */
    return Py_NewRef(value);
}

/* dict lookup of a bytes key made from buf[0:n]: a borrowed reference, NULL if absent (or on error,
   with an exception set) */
static PyObject *lookup(PyObject *dict, const char *buf, Py_ssize_t n) {
    PyObject *key = PyBytes_FromStringAndSize(buf, n);
    if (key == NULL) return NULL;
    PyObject *hit = PyDict_GetItemWithError(dict, key);
    Py_DECREF(key);
    return hit;
}

/* The last stamp looked up in a call: the series of one scrape share their timestamp, so most
   lookups are of the same 7 bytes. ``ts`` is borrowed from ``stamps``, which does not change
   during a call. */
typedef struct {
    unsigned char tail[7];
    PyObject *ts;
} LastStamp;

static PyObject *stamp_of(PyObject *stamps, const unsigned char *tail, LastStamp *last) {
    if (last->ts != NULL && memcmp(last->tail, tail, 7) == 0) return last->ts;
    PyObject *ts = lookup(stamps, (const char *)tail, 7);
    if (ts != NULL) {
        memcpy(last->tail, tail, 7);
        last->ts = ts;
    }
    return ts;
}

/* 1: held (or late, *late incremented); 2: ignored; 0: not this loop's case (hand it back); -1: error */
static int hold_one(PyObject *raw, PyObject *prefixes, PyObject *stamps, LastStamp *last, Py_ssize_t *late) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    PyObject *set = NULL, *ts = NULL;
    double value = 0.0;
    if (n < 18) return 0;
    if (p[n - 16] == 0x09) {
        set = lookup(prefixes, (const char *)p, n - 18);
        if (set == NULL && PyErr_Occurred()) return -1;
        if (set != NULL) {
            if (p[n - 18] != 0x12 || p[n - 17] != 0x10) {
                set = NULL;
            } else {
                unsigned char le[8];
                memcpy(le, p + n - 15, 8); /* the wire's double is little-endian */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
                for (int i = 0; i < 4; i++) {
                    unsigned char t = le[i];
                    le[i] = le[7 - i];
                    le[7 - i] = t;
                }
#endif
                memcpy(&value, le, 8);
                ts = stamp_of(stamps, p + n - 7, last);
                if (ts == NULL) {
                    if (PyErr_Occurred()) return -1;
                    set = NULL;
                }
            }
        }
    }
    if (set == NULL && p[n - 9] == 0x12 && p[n - 8] == 0x07) {
        set = lookup(prefixes, (const char *)p, n - 9);
        if (set == NULL && PyErr_Occurred()) return -1;
        if (set != NULL) {
            value = 0.0;
            ts = stamp_of(stamps, p + n - 7, last);
            if (ts == NULL) {
                if (PyErr_Occurred()) return -1;
                set = NULL;
            }
        }
    }
    if (set == NULL) return 0;

    int ok = 0;
    PyObject *node = NULL, *node_ts = NULL, *gpu = NULL, *rows = NULL;
    node = attr(set, s_node);
    if (node == NULL) goto error;
    if (node == Py_None) {
        PyObject *name = attr(set, s_name);
        if (name == NULL) goto error;
        ok = name == Py_None ? 2 : 0;
        Py_DECREF(name);
        goto done;
    }
    if (!isfinite(value)) goto done;
    node_ts = attr(node, s_ts);
    if (node_ts == NULL) goto error;
    int same = PyObject_RichCompareBool(node_ts, ts, Py_EQ);
    if (same < 0) goto error;
    if (!same) goto done;
    gpu = attr(set, s_gpu);
    if (gpu == NULL) goto error;
    if (gpu == Py_None) goto done;
    if (!PyTuple_CheckExact(gpu) || PyTuple_GET_SIZE(gpu) != 4) goto done;
    rows = attr(node, s_rows);
    if (rows == NULL) goto error;
    if (rows == Py_None) {
        (*late)++;
        ok = 1;
        goto done;
    }
    if (!PyDict_Check(rows)) goto done;
    PyObject *row = PyDict_GetItemWithError(rows, PyTuple_GET_ITEM(gpu, 0));
    PyObject *uuid = PyTuple_GET_ITEM(gpu, 3);  /* written with each value where a GPU's series disagree */
    PyObject *series = NULL;
    if (row == NULL) {
        /* the GPU's first value of this scrape: its row is made, and its series' uuid written, as
           Assembler._hold does (rows is the scrape's defaultdict(dict)) */
        if (PyErr_Occurred()) goto error;
        series = attr(set, s_series);
        if (series == NULL) goto error;
        uuid = PyObject_GetAttr(series, s_uuid);
        Py_DECREF(series);
        if (uuid == NULL) goto error;
        Py_DECREF(uuid);  /* the series holds it; borrowed from here on */
        row = PyDict_New();
        if (row == NULL) goto error;
        int added = PyDict_SetItem(rows, PyTuple_GET_ITEM(gpu, 0), row);
        Py_DECREF(row);  /* rows holds it */
        if (added < 0) goto error;
    }
    if (!PyDict_Check(row)) goto done;
    PyObject *boxed = PyFloat_FromDouble(value);
    if (boxed == NULL) goto error;
    int rc = PyDict_SetItem(row, PyTuple_GET_ITEM(gpu, 1), boxed);
    Py_DECREF(boxed);
    if (rc < 0) goto error;
    int has_uuid = PyObject_IsTrue(uuid);
    if (has_uuid < 0) goto error;
    if (has_uuid) {
        PyObject *meta = attr(node, s_meta);
        if (meta == NULL) goto error;
        rc = PyObject_SetItem(meta, PyTuple_GET_ITEM(gpu, 2), uuid);
        Py_DECREF(meta);
        if (rc < 0) goto error;
    }
    ok = 1;
done:
    Py_XDECREF(node);
    Py_XDECREF(node_ts);
    Py_XDECREF(gpu);
    Py_XDECREF(rows);
    return ok;
error:
    Py_XDECREF(node);
    Py_XDECREF(node_ts);
    Py_XDECREF(gpu);
    Py_XDECREF(rows);
    return -1;
}

PyDoc_STRVAR(hold_inline_doc,
"hold_inline(series, prefixes, stamps) -> (raw or None, held, late)\n"
"\n"
"Holds the series of the iterator ``series`` that are assembler._read's inline case, until one\n"
"that is not (returned, for the Python loop) or the end (None). See _remote_write.c.");

static PyObject *hold_inline(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *it, *prefixes, *stamps;
    if (!PyArg_ParseTuple(args, "OO!O!:hold_inline", &it, &PyDict_Type, &prefixes, &PyDict_Type, &stamps))
        return NULL;
    if (!PyIter_Check(it)) {
        PyErr_SetString(PyExc_TypeError, "hold_inline: series is not an iterator");
        return NULL;
    }
    Py_ssize_t held = 0, late = 0, ignored = 0;
    LastStamp last = {{0}, NULL};
    PyObject *raw;
    while ((raw = PyIter_Next(it)) != NULL) {
        int r = PyBytes_CheckExact(raw) ? hold_one(raw, prefixes, stamps, &last, &late) : 0;
        if (r < 0) {
            Py_DECREF(raw);
            return NULL;
        }
        if (r == 0)
            return Py_BuildValue("(Nnnn)", raw, held, late, ignored);
        if (r == 2)
            ignored++;
        else
            held++;
        Py_DECREF(raw);
    }
    if (PyErr_Occurred()) return NULL;
    return Py_BuildValue("(Onnn)", Py_None, held, late, ignored);
}

static PyMethodDef methods[] = {
    {"hold_inline", hold_inline, METH_VARARGS, hold_inline_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_remote_write",
    "The remote-write receiver's commonest series held in C (see _remote_write.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__remote_write(void) {
    if (!(s_node = PyUnicode_InternFromString("node")) || !(s_ts = PyUnicode_InternFromString("ts")) ||
        !(s_gpu = PyUnicode_InternFromString("gpu")) || !(s_rows = PyUnicode_InternFromString("rows")) ||
        !(s_meta = PyUnicode_InternFromString("meta")) || !(s_name = PyUnicode_InternFromString("name")) ||
        !(s_series = PyUnicode_InternFromString("series")) || !(s_uuid = PyUnicode_InternFromString("uuid")))
        return NULL;
    return PyModule_Create(&module);
}
