"""The C++ source of dnntune's direct cuDNN caller (:mod:`dnntune.providers.cudnn.direct`),
built by :mod:`dnntune.backend.native` like its other helpers.

``make(...)`` takes a finalized cuDNN execution plan (its descriptor's address), the addresses
of cuDNN's backend functions (read with ctypes from the libcudnn this process has loaded), the
variant pack's uids and where each slot's pointer comes from (an item of the call, a constant
address, or a value passed by value, kept in the capsule), and returns a capsule that owns the
plan and the variant packs built for it.
``run(capsule, items, workspace, handle)`` reads the items' addresses (tensors through
PyTorch's exported ``data_ptr`` function, or ints, or 8 bytes an address), finds the variant
pack made for those addresses (a most-recent-first list, built on a miss: one descriptor per
address set) and calls ``cudnnBackendExecute``: one C call per execute, where the frontend's
``_execute_plan_at_index`` converts a dict and builds and destroys a variant pack every time.
For addresses of the plan's tensors that are not 16-byte aligned it runs nothing and returns
False (checked where a pack is made; the caller runs the plan on aligned copies,
:mod:`dnntune.providers.cudnn.alignment`).

The source includes no cuDNN header: the backend API's few functions are called through the
addresses given, and its enum values (stable within cuDNN 9's ABI) are passed in by ``make``.
"""

from __future__ import annotations

from dnntune.backend.native import Helper

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

typedef int (*create_fn)(int, void **);
typedef int (*set_fn)(void *, int, int, int64_t, const void *);
typedef int (*finalize_fn)(void *);
typedef int (*execute_fn)(void *, void *, void *);
typedef int (*destroy_fn)(void *);
typedef const char *(*error_fn)(int);
typedef void *(*data_ptr_fn)(PyObject *);

static const char *CAPSULE = "dnntune.cudnn_direct";

struct Entry {
    std::vector<uint64_t> key;  // the items' addresses, then the workspace's
    void *pack;
};

struct Direct {
    create_fn create;
    set_fn set;
    finalize_fn finalize;
    execute_fn execute;
    destroy_fn destroy;
    error_fn error;
    data_ptr_fn data_ptr;
    PyObject *tensor_type;  // owned
    void *plan;             // owned
    int vp_desc, vp_uids, vp_ptrs, vp_ws, t_int64, t_ptr;
    std::vector<int64_t> uids;
    std::vector<uint64_t> consts;
    // -1: the slot's constant is its address; -2: the constant is its value (8 bytes, little
    // endian), passed by its address here (cuDNN reads by-value tensors from host memory)
    std::vector<int32_t> item_of_slot;
    Py_ssize_t n_items;
    size_t limit;
    std::vector<Entry> cache;  // most recently used first
};

static void release(PyObject *capsule) {
    Direct *d = static_cast<Direct *>(PyCapsule_GetPointer(capsule, CAPSULE));
    if (d == NULL) {
        PyErr_Clear();
        return;
    }
    for (auto &e : d->cache) {
        d->destroy(e.pack);
    }
    if (d->plan != NULL) {
        d->destroy(d->plan);
    }
    Py_XDECREF(d->tensor_type);
    delete d;
}

static bool read_bytes(PyObject *b, size_t want, void *into, const char *what) {
    if (!PyBytes_CheckExact(b) || (size_t)PyBytes_GET_SIZE(b) != want) {
        PyErr_Format(PyExc_TypeError, "make(): %s must be %zu bytes", what, want);
        return false;
    }
    std::memcpy(into, PyBytes_AS_STRING(b), want);
    return true;
}

// make(functions: bytes (7 addresses), plan: int, enums: tuple of 6 ints, uids: bytes (int64
// each), consts: bytes (uint64 each), items: bytes (int32 each), n_items: int, tensor type,
// limit: int) -> capsule
static PyObject *make(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "make() takes 9 arguments");
        return NULL;
    }
    if (!PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 6 || !PyType_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "make(): bad enums or tensor type");
        return NULL;
    }
    uint64_t fns[7];
    if (!read_bytes(args[0], sizeof fns, fns, "functions")) {
        return NULL;
    }
    if (!PyBytes_CheckExact(args[3]) || PyBytes_GET_SIZE(args[3]) % 8 != 0) {
        PyErr_SetString(PyExc_TypeError, "make(): uids must be bytes of int64");
        return NULL;
    }
    size_t slots = (size_t)PyBytes_GET_SIZE(args[3]) / 8;
    if (slots == 0) {
        PyErr_SetString(PyExc_ValueError, "make(): no variant pack slots");
        return NULL;
    }
    Direct *d = new Direct();
    d->uids.resize(slots);
    d->consts.resize(slots);
    d->item_of_slot.resize(slots);
    int enums[6];
    for (int i = 0; i < 6; i++) {
        enums[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(args[2], i));
    }
    d->n_items = PyLong_AsSsize_t(args[6]);
    unsigned long long plan = PyLong_AsUnsignedLongLong(args[1]);
    long long limit = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred() || !read_bytes(args[3], slots * 8, d->uids.data(), "uids") ||
        !read_bytes(args[4], slots * 8, d->consts.data(), "consts") ||
        !read_bytes(args[5], slots * 4, d->item_of_slot.data(), "items")) {
        delete d;
        return NULL;
    }
    for (size_t s = 0; s < slots; s++) {
        if (d->item_of_slot[s] >= d->n_items || d->item_of_slot[s] < -2) {
            delete d;
            PyErr_SetString(PyExc_ValueError, "make(): an item index past the items");
            return NULL;
        }
    }
    d->create = reinterpret_cast<create_fn>(static_cast<uintptr_t>(fns[0]));
    d->set = reinterpret_cast<set_fn>(static_cast<uintptr_t>(fns[1]));
    d->finalize = reinterpret_cast<finalize_fn>(static_cast<uintptr_t>(fns[2]));
    d->execute = reinterpret_cast<execute_fn>(static_cast<uintptr_t>(fns[3]));
    d->destroy = reinterpret_cast<destroy_fn>(static_cast<uintptr_t>(fns[4]));
    d->error = reinterpret_cast<error_fn>(static_cast<uintptr_t>(fns[5]));
    d->data_ptr = reinterpret_cast<data_ptr_fn>(static_cast<uintptr_t>(fns[6]));
    d->vp_desc = enums[0];
    d->vp_uids = enums[1];
    d->vp_ptrs = enums[2];
    d->vp_ws = enums[3];
    d->t_int64 = enums[4];
    d->t_ptr = enums[5];
    d->limit = limit > 0 ? (size_t)limit : 1;
    Py_INCREF(args[7]);
    d->tensor_type = args[7];
    d->plan = reinterpret_cast<void *>(static_cast<uintptr_t>(plan));  // owned from here on
    PyObject *capsule = PyCapsule_New(d, CAPSULE, release);
    if (capsule == NULL) {
        d->plan = NULL;  // the caller still owns it
        Py_DECREF(d->tensor_type);
        delete d;
    }
    return capsule;
}

static bool status_error(Direct *d, int status, const char *what) {
    const char *text = d->error != NULL ? d->error(status) : NULL;
    PyErr_Format(PyExc_RuntimeError, "cuDNN %s failed: %s (status %d)", what,
                 text != NULL ? text : "unknown", status);
    return false;
}

static void *new_pack(Direct *d, const uint64_t *key) {
    size_t slots = d->uids.size();
    std::vector<void *> ptrs(slots);
    for (size_t s = 0; s < slots; s++) {
        int32_t item = d->item_of_slot[s];
        if (item == -2) {  // passed by value: the address of the value kept here
            ptrs[s] = static_cast<void *>(&d->consts[s]);
            continue;
        }
        uint64_t value = item < 0 ? d->consts[s] : key[item];
        ptrs[s] = reinterpret_cast<void *>(static_cast<uintptr_t>(value));
    }
    void *ws = reinterpret_cast<void *>(static_cast<uintptr_t>(key[d->n_items]));
    void *pack = NULL;
    int st = d->create(d->vp_desc, &pack);
    if (st != 0) {
        status_error(d, st, "variant pack creation");
        return NULL;
    }
    if ((st = d->set(pack, d->vp_uids, d->t_int64, (int64_t)slots, d->uids.data())) != 0 ||
        (st = d->set(pack, d->vp_ptrs, d->t_ptr, (int64_t)slots, ptrs.data())) != 0 ||
        (st = d->set(pack, d->vp_ws, d->t_ptr, 1, &ws)) != 0 || (st = d->finalize(pack)) != 0) {
        d->destroy(pack);
        status_error(d, st, "variant pack");
        return NULL;
    }
    return pack;
}

// run(capsule, items, workspace: int, handle: int) -> None (False: misaligned, nothing run)
static PyObject *run(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run() takes 4 arguments");
        return NULL;
    }
    Direct *d = static_cast<Direct *>(PyCapsule_GetPointer(args[0], CAPSULE));
    if (d == NULL) {
        return NULL;
    }
    Py_ssize_t n = d->n_items;
    uint64_t stack[33];
    std::vector<uint64_t> heap;
    uint64_t *key = stack;
    if (n + 1 > 33) {
        heap.resize(n + 1);
        key = heap.data();
    }
    PyObject *items = args[1];
    if (PyBytes_CheckExact(items)) {
        if (PyBytes_GET_SIZE(items) != n * 8) {
            PyErr_Format(PyExc_ValueError, "run(): %zd addresses expected", n);
            return NULL;
        }
        std::memcpy(key, PyBytes_AS_STRING(items), n * 8);
    } else {
        PyObject *seq = PySequence_Fast(items, "run(): items must be a sequence");
        if (seq == NULL) {
            return NULL;
        }
        if (PySequence_Fast_GET_SIZE(seq) != n) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "run(): %zd items expected", n);
            return NULL;
        }
        PyObject **objs = PySequence_Fast_ITEMS(seq);
        try {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *o = objs[i];
                if (PyObject_TypeCheck(o, (PyTypeObject *)d->tensor_type)) {
                    key[i] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(d->data_ptr(o)));
                } else if (PyLong_Check(o)) {
                    key[i] = PyLong_AsUnsignedLongLong(o);
                    if (PyErr_Occurred()) {
                        Py_DECREF(seq);
                        return NULL;
                    }
                } else {
                    Py_DECREF(seq);
                    PyErr_Format(PyExc_TypeError, "run(): item %zd is a %s, not a tensor", i,
                                 Py_TYPE(o)->tp_name);
                    return NULL;
                }
            }
        } catch (const std::exception &e) {
            Py_DECREF(seq);
            std::string what(e.what());
            PyErr_SetString(PyExc_RuntimeError, what.substr(0, what.find('\n')).c_str());
            return NULL;
        } catch (...) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_RuntimeError, "data pointer not readable");
            return NULL;
        }
        Py_DECREF(seq);
    }
    key[n] = PyLong_AsUnsignedLongLong(args[2]);
    void *handle = PyLong_AsVoidPtr(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    size_t bytes = (size_t)(n + 1) * 8;
    void *pack = NULL;
    std::vector<Entry> &cache = d->cache;
    for (size_t i = 0; i < cache.size(); i++) {
        if (std::memcmp(cache[i].key.data(), key, bytes) == 0) {
            pack = cache[i].pack;
            if (i > 0) {
                Entry hit = std::move(cache[i]);
                cache.erase(cache.begin() + (Py_ssize_t)i);
                cache.insert(cache.begin(), std::move(hit));
            }
            break;
        }
    }
    if (pack == NULL) {
        // the plan was built for 16-byte aligned tensors: a misaligned one is the caller's to
        // stage (False, nothing run); checked here, where a pack is made, not on every call
        for (size_t s = 0; s < d->uids.size(); s++) {
            int32_t item = d->item_of_slot[s];
            if (item >= 0 && (key[item] & 15u) != 0) {
                Py_RETURN_FALSE;
            }
        }
        pack = new_pack(d, key);
        if (pack == NULL) {
            return NULL;
        }
        if (cache.size() >= d->limit) {
            d->destroy(cache.back().pack);
            cache.pop_back();
        }
        cache.insert(cache.begin(), Entry{std::vector<uint64_t>(key, key + n + 1), pack});
    }
    int st = d->execute(handle, d->plan, pack);
    if (st != 0) {
        status_error(d, st, "execute");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *packs(PyObject *, PyObject *capsule) {
    Direct *d = static_cast<Direct *>(PyCapsule_GetPointer(capsule, CAPSULE));
    if (d == NULL) {
        return NULL;
    }
    return PyLong_FromSize_t(d->cache.size());
}

static PyMethodDef methods[] = {
    {"make", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(make)), METH_FASTCALL,
     "A capsule that owns a cuDNN plan and its variant packs."},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(run)), METH_FASTCALL,
     "Execute the capsule's plan on the items' addresses."},
    {"packs", packs, METH_O, "How many variant packs the capsule holds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};

PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&module); }
"""

#: a build is loaded in a fresh process and refuses bad arguments cleanly (no GPU needed)
CHECK = r"""
for call in (lambda: module.make(1), lambda: module.run(None, (), 0, 0), lambda: module.packs(1)):
    try:
        call()
    except (TypeError, ValueError):
        pass
    else:
        raise SystemExit("a bad call was accepted")
print("ok")
"""

HELPER = Helper(kind="cudnn", source=SOURCE, check=CHECK)
