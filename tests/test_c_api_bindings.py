"""Every ctypes declaration of the native library matches its prototype in native/include: the same number of
arguments, each of the same kind (pointer or scalar, integer or floating, its size) and, for typed pointers, the
same pointee. ctypes converts arguments by these declarations without seeing the C side, so a wrong one only shows
on a GPU (a missing argument in openjet_engine_mtp_draft_sampled's list was found by review, 2026-12-05); this
checks them on any machine, against the headers the library is compiled from."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from openjet_launcher.engine import cuda, kernels_test, kernels_test_attn, kernels_test_gdn, native

INCLUDE = Path(__file__).resolve().parents[1] / "native" / "include"

SCALARS = {  # C scalar -> (floating, bytes)
    "int": (False, 4), "int32_t": (False, 4), "uint32_t": (False, 4), "uint16_t": (False, 2),
    "uint8_t": (False, 1), "size_t": (False, ctypes.sizeof(ctypes.c_size_t)), "int64_t": (False, 8),
    "uint64_t": (False, 8), "float": (True, 4), "double": (True, 8), "char": (False, 1),
}


def prototypes() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, parameter types) of every OPENJET_API function in the headers."""
    found = {}
    for header in sorted(INCLUDE.glob("*.h")):
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(), flags=re.S)
        for ret, name, params in re.findall(r"OPENJET_API\s+([\w\s\*]+?)\s*\b(openjet_\w+)\s*\(([^)]*)\)\s*;", text):
            types = []
            for p in (x.strip() for x in params.split(",")):
                if p in ("", "void"):
                    continue
                types.append(re.sub(r"\s*\b\w+$", "", p) if not p.endswith("*") else p)  # drop the name
            found[name] = (" ".join(ret.replace("const", "").split()), [" ".join(t.replace("const", "").split()) for t in types])
    return found


def kind_of_c(t: str):
    """('ptr', pointee kind or None for void / struct) or ('scalar', (floating, bytes))."""
    t = t.replace(" *", "*").strip()
    if t.endswith("*"):
        base = t[:-1].strip()
        if base.endswith("*"):
            return ("ptr", "ptr")
        return ("ptr", SCALARS.get(base))  # None: void or a struct
    assert t in SCALARS, f"a C type this test does not know: {t!r}"
    return ("scalar", SCALARS[t])


def kind_of_ctypes(c):
    if c in (ctypes.c_void_p, ctypes.c_char_p):
        return ("ptr", SCALARS["char"] if c is ctypes.c_char_p else None)
    if isinstance(c, type) and issubclass(c, ctypes._Pointer):
        target = c._type_
        if target is ctypes.c_void_p or (isinstance(target, type) and issubclass(target, ctypes._Pointer)):
            return ("ptr", "ptr")
        if isinstance(target, type) and issubclass(target, ctypes.Structure):
            return ("ptr", None)
        return ("ptr", (target in (ctypes.c_float, ctypes.c_double), ctypes.sizeof(target)))
    return ("scalar", (c in (ctypes.c_float, ctypes.c_double), ctypes.sizeof(c)))


def compatible(c_kind, py_kind) -> bool:
    if c_kind[0] != py_kind[0]:
        return False
    if c_kind[0] == "scalar":
        return c_kind[1] == py_kind[1]
    # a typed C pointer may be declared c_void_p (the tests' generic pointers); a typed ctypes pointer must point
    # at what C points at (void and struct pointees: only c_void_p, a struct pointer or a pointer to one)
    return py_kind[1] is None or c_kind[1] == py_kind[1] or (c_kind[1] is None and py_kind[1] == "ptr")


class Recorder:
    """Stands for a loaded library: records the argtypes / restype given to each function."""

    def __init__(self):
        object.__setattr__(self, "fns", {})

    def __getattr__(self, name):
        if not name.startswith("openjet_"):  # (cuda._declare asks for its own marker first)
            raise AttributeError(name)
        return self.fns.setdefault(name, type("Fn", (), {"argtypes": None, "restype": ctypes.c_int})())

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)


def declared(monkeypatch) -> dict[str, object]:
    """Every function the Python side declares, through its own declaring code run on a Recorder."""
    lib = Recorder()
    native._declare(lib)
    cuda._declare(lib)
    monkeypatch.setattr(kernels_test, "load_library", lambda: lib)
    monkeypatch.setattr(kernels_test, "_declared", set())
    for binder in (kernels_test._lib, kernels_test._lib_imma, kernels_test_attn._lib, kernels_test_gdn._lib):
        binder()
    return {name: fn for name, fn in lib.fns.items() if fn.argtypes is not None}


def test_the_headers_are_parsed_whole():
    protos = prototypes()
    assert len(protos) >= 60, len(protos)  # 67 OPENJET_API functions on 2026-12-05
    assert protos["openjet_engine_mtp_draft_sampled"][1][-4:] == ["int32_t*", "int32_t*", "double*", "int*"]
    assert protos["openjet_engine_create"][1][-1] == "openjet_engine**"


def test_every_ctypes_declaration_matches_its_c_prototype(monkeypatch):
    protos, decl = prototypes(), declared(monkeypatch)
    assert "openjet_engine_mtp_draft_sampled" in decl and "openjet_test_gdn_step" in decl
    wrong = []
    for name, fn in sorted(decl.items()):
        assert name in protos, f"{name} is declared in Python but in no header"
        ret, params = protos[name]
        if len(fn.argtypes) != len(params):
            wrong.append(f"{name}: {len(fn.argtypes)} arguments declared, the header has {len(params)}")
            continue
        for i, (c_t, py_t) in enumerate(zip(params, fn.argtypes)):
            if not compatible(kind_of_c(c_t), kind_of_ctypes(py_t)):
                wrong.append(f"{name}: argument {i + 1} is {c_t} in C, declared {py_t.__name__}")
        if fn.restype is None:
            if ret != "void":
                wrong.append(f"{name}: returns {ret}, declared void")
        elif ret == "void" or not compatible(kind_of_c(ret), kind_of_ctypes(fn.restype)):
            wrong.append(f"{name}: returns {ret}, declared {fn.restype.__name__}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("c_type, py_type, ok", [
    ("int32_t*", ctypes.POINTER(ctypes.c_int32), True), ("int32_t*", ctypes.POINTER(ctypes.c_double), False),
    ("double*", ctypes.c_void_p, True), ("int", ctypes.c_double, False), ("size_t", ctypes.c_size_t, True),
    ("float", ctypes.c_float, True), ("float", ctypes.c_int, False), ("int*", ctypes.c_int, False),
    ("openjet_engine**", ctypes.POINTER(ctypes.c_void_p), True),
])
def test_the_comparison_itself_tells_kinds_apart(c_type, py_type, ok):
    assert compatible(kind_of_c(c_type), kind_of_ctypes(py_type)) is ok


def test_the_counted_paths_are_launch_count_h_s_numbers():
    """kernels_test.COUNTED (the names tests pass to launch_count) against native/src/launch_count.h's Counted enum,
    the numbers openjet_test_launch_count takes: each enumerator's snake_case name with its number, and nothing else.
    A shifted number would make a GPU test count another path's launches (and pass on a silent fallback)."""
    header = (INCLUDE.parent / "src" / "launch_count.h").read_text()
    enum = re.search(r"enum class Counted \{(.*?)\};", header, flags=re.S).group(1)
    numbers = {re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(): int(value)
               for name, value in re.findall(r"^\s*k(\w+) = (\d+),", enum, flags=re.M)}
    assert numbers["dense_gemm"] == 0 and len(numbers) >= 29, numbers
    assert kernels_test.COUNTED == numbers
