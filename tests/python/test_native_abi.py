"""The Python package's ctypes declarations against capi/kvharbor_c.h.

kvharbor._native (and kvharbor.engine, kvharbor.layout) declare every C
struct and function by hand; nothing else would notice two same-typed
fields swapped or a function whose arguments drifted. Here:

- every struct of the header has a ctypes twin (named like it: kvh_fetch_source
  is _FetchSource) and every ctypes struct a header twin, with the same size
  and the same fields in the same order: name, offset, size and type. Sizes
  and offsets come from the C compiler (kvharbor_capi_abi_layout, built from
  the header by capi/CMakeLists.txt; KVHARBOR_ABI_LAYOUT names it);
- every KVH_API function of the header is in _native._SIGNATURES and the
  other way round, with the same return type and argument types.

Runs without a daemon.
"""

import ctypes
import os
import re
import subprocess
import unittest

import capi_abi
from kvharbor import _native, engine, layout

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
_HEADER = os.path.join(_ROOT, "capi", "kvharbor_c.h")

# C scalar types and their ctypes (ctypes aliases the same-sized ones, e.g.
# c_uint64 is c_ulong is c_size_t on LP64: those compare equal).
_SCALARS = {
    "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
    "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
    "uint8_t": ctypes.c_uint8, "int": ctypes.c_int,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float,
    "double": ctypes.c_double,
}

# ctypes structs that mirror no header struct: Python's own Py_buffer, and
# kvh_namespace_spec as ABI 2 defined it (checked as its prefix below).
_NOT_IN_HEADER = {"_PyBuffer", "_NamespaceSpecV2"}


def header_name(cls):
    """kvh_fetch_source for _FetchSource."""
    return "kvh_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.lstrip("_")).lower()


def ctypes_structs():
    """{class name: class} of every ctypes.Structure the package declares."""
    out = {}
    for module in (_native, engine, layout):
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, ctypes.Structure)
                    and value is not ctypes.Structure):
                out[value.__name__] = value
    return out


def mismatch(ctype, py, structs, opaque):
    """Why the ctypes type `py` cannot carry the C type `ctype`, or None.

    A pointer may be declared c_void_p whatever it points to (the package
    passes buffers and handles as addresses), a char pointer c_char_p, or
    POINTER(T) of a T that carries the pointee."""
    if ctype.pointers == 0:
        if ctype.base in structs:
            if not (isinstance(py, type) and issubclass(py, ctypes.Structure)):
                return f"{py} is not a struct"
            if header_name(py) != ctype.base:
                return f"{py.__name__} is not {ctype.base}"
            return None
        want = _SCALARS.get(ctype.base)
        if want is None:
            return f"no ctypes type known for {ctype}"
        return None if py is want else f"{py.__name__} is not {ctype}"
    if py is ctypes.c_void_p:
        return None
    if py is ctypes.c_char_p:
        if ctype.pointers == 1 and ctype.base == "char":
            return None
        return f"c_char_p is not {ctype}"
    if ctype.pointers == 1 and ctype.base in opaque:
        return f"{ctype} is a handle: declare it c_void_p"
    pointee = getattr(py, "_type_", None)
    if not isinstance(py, type) or not issubclass(py, ctypes._Pointer):
        return f"{getattr(py, '__name__', py)} is not a pointer ({ctype})"
    why = mismatch(ctype.pointee(), pointee, structs, opaque)
    return None if why is None else f"{ctype}: {why}"


def type_name(py):
    return "void" if py is None else getattr(py, "__name__", repr(py))


class NativeAbiTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(_HEADER, encoding="utf-8") as f:
            cls.structs, cls.opaque, cls.functions = capi_abi.parse_header(
                f.read())
        program = os.environ.get("KVHARBOR_ABI_LAYOUT")
        if not program:
            raise RuntimeError(
                "KVHARBOR_ABI_LAYOUT must name kvharbor_capi_abi_layout "
                "(ctest sets it)")
        cls.sizes, cls.layout = {}, {}
        out = subprocess.run([program], check=True, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            words = line.split()
            if words[0] == "struct":
                cls.sizes[words[1]] = int(words[2])
                cls.layout[words[1]] = []
            else:
                cls.layout[words[1]].append(
                    (words[2], int(words[3]), int(words[4])))
        cls.py = ctypes_structs()

    def test_parser_reads_the_whole_header(self):
        # The compiler saw the same structs and fields the parser did.
        self.assertEqual(sorted(self.sizes), sorted(self.structs))
        for name, fields in self.structs.items():
            self.assertEqual([f for f, _ in fields],
                             [f for f, _, _ in self.layout[name]], name)
        self.assertGreater(len(self.functions), 60)

    def test_every_struct_has_a_twin(self):
        py = {header_name(c) for n, c in self.py.items()
              if n not in _NOT_IN_HEADER}
        self.assertEqual(sorted(set(self.structs) - py), [],
                         "header structs without a ctypes declaration")
        self.assertEqual(sorted(py - set(self.structs)), [],
                         "ctypes structs that the header does not declare")

    def test_struct_layouts(self):
        for cls_name, cls in sorted(self.py.items()):
            if cls_name in _NOT_IN_HEADER:
                continue
            name = header_name(cls)
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(cls), self.sizes[name],
                                 f"sizeof({name})")
                py_fields = [(f, getattr(cls, f).offset, getattr(cls, f).size)
                             for f, _ in cls._fields_]
                self.assertEqual(py_fields, self.layout[name],
                                 f"{name}: (field, offset, size) in order")
                for (field, ctype), (_, py) in zip(self.structs[name],
                                                   cls._fields_):
                    why = mismatch(ctype, py, self.structs, self.opaque)
                    self.assertIsNone(why, f"{name}.{field}: {why}")

    def test_spec_v2_is_the_abi2_prefix(self):
        v2 = _native._NamespaceSpecV2
        whole = self.layout["kvh_namespace_spec"]
        prefix = [(f, getattr(v2, f).offset, getattr(v2, f).size)
                  for f, _ in v2._fields_]
        self.assertEqual(prefix, whole[:len(prefix)])
        self.assertEqual(whole[len(prefix)][0], "kvcm_path")
        self.assertEqual(ctypes.sizeof(v2), whole[len(prefix)][1])

    def test_every_function_is_declared(self):
        py = set(_native._SIGNATURES)
        self.assertEqual(sorted(set(self.functions) - py), [],
                         "header functions missing from _native._SIGNATURES")
        self.assertEqual(sorted(py - set(self.functions)), [],
                         "_native._SIGNATURES functions the header lacks")
        self.assertEqual(sorted(set(_native._SINCE_ABI) - py), [],
                         "_SINCE_ABI names functions without a signature")

    def test_function_signatures(self):
        for name, (ret, args) in sorted(self.functions.items()):
            if name not in _native._SIGNATURES:
                continue  # test_every_function_is_declared names it
            py_ret, py_args = _native._SIGNATURES[name]
            with self.subTest(function=name):
                if ret is None:
                    self.assertIsNone(py_ret, f"{name} returns void")
                else:
                    why = mismatch(ret, py_ret, self.structs, self.opaque)
                    self.assertIsNone(why, f"{name} returns {ret}: {why}")
                self.assertEqual(
                    len(py_args), len(args),
                    f"{name}: {len(args)} arguments in the header, "
                    f"{len(py_args)} in _SIGNATURES "
                    f"({', '.join(type_name(a) for a in py_args)})")
                for i, (ctype, py) in enumerate(zip(args, py_args)):
                    why = mismatch(ctype, py, self.structs, self.opaque)
                    self.assertIsNone(why, f"{name} argument {i}: {why}")


if __name__ == "__main__":
    unittest.main()
