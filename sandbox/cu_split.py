"""The text half of the split CUDA build (sandbox/split_cuda.py): one ``.cu`` into a device unit
(no torch) and a host unit (the torch-using host code, launches rewritten as calls of generated stubs).

The splitter is a hand-written scanner (comments, string, raw string and char literals, digit
separators; brace / paren / bracket matching), not a parser: no C++ parser on PyPI both handles
CUDA's qualifiers and ``<<<>>>`` and is robust to the partial, macro-laden code models write
(libclang would need the CUDA and torch headers to parse the very file whose header parse we are
avoiding). It only has to find top-level declarations and launch sites, and whatever it is not
sure of (:class:`Doubt`: templated kernels, a kernel named other than at a launch, device
variables named in host code, namespaces, ``extern "C"``, thrust / cub, macros holding launches or
CUDA qualifiers, torch names in device code, unbalanced text) makes the whole call fall back to
torch's build. A unit that does not compile or link also falls back: a wrong split can cost time,
never a wrong module.
"""
from __future__ import annotations

import re


class Doubt(ValueError):
    """The splitter is not sure of this ``.cu``: the call is built torch's way."""


IDENT = re.compile(r"[A-Za-z_]\w*")
_TORCH = re.compile(r"\b(?:torch|at|c10|caffe2|pybind11|py)\s*::|\bTensor\b|\b(?:AT|TORCH|C10)_[A-Z0-9_]+")
_TORCH_INCLUDE = re.compile(r'#\s*include\s*[<"](?:torch|ATen|c10|caffe2|pybind11|THC)/|#\s*include\s*[<"]Python\.h')
_NO_SPLIT = re.compile(r'#\s*include\s*[<"](?:thrust|cub)/|\b(?:thrust|cub)\s*::')
_DEVICE_WORDS = {"__device__", "__constant__", "__shared__", "__managed__"}
_QUALIFIERS = re.compile(r"\b(?:__global__|__device__|__constant__|__shared__|__managed__)\b")
# host code that takes a kernel or a device symbol by address: the split cannot carry these
_SYMBOL_APIS = re.compile(r"\bcuda(?:MemcpyToSymbol|MemcpyFromSymbol|GetSymbolAddress|GetSymbolSize|LaunchKernel|"
                          r"LaunchCooperativeKernel|FuncSetAttribute|FuncGetAttributes|OccupancyMax\w*)\b")
_STRUCTURAL = {"struct", "class", "union", "enum", "typedef", "using", "static_assert"}
_CV = {"const", "volatile", "__restrict__", "__restrict", "restrict", "register"}
_TYPE_WORDS = _CV | {
    "void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned", "size_t", "ptrdiff_t",
    "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "uintptr_t",
    "half", "__half", "__half2", "__nv_bfloat16", "__nv_bfloat162", "dim3", "cudaStream_t"} | {
    f"{base}{n}" for base in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "longlong",
                              "ulonglong", "float", "double") for n in (1, 2, 3, 4)}
# the launch configuration as CUDA's <<<grid, block, shmem, stream>>> converts it (both units define it)
CONFIG_STRUCT = """\
struct sbx_launch_config {  // sandbox/split_cuda.py: a <<<grid, block, shmem, stream>>> configuration
  dim3 grid, block; size_t shmem; cudaStream_t stream;
  sbx_launch_config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), shmem(s), stream(st) {}
};
"""


def mask(text: str) -> str:
    """``text`` with comments and the insides of string / char literals blanked (newlines kept), so
    that every offset still points at the same character of ``text``."""
    out, i, n = list(text), 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text.startswith("\\\n", j) else 1  # a backslash continues a // comment
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise Doubt("unterminated comment")
            blank(i, j + 2)
            i = j + 2
        elif c.isdigit() or (c == "." and text[i + 1:i + 2].isdigit()):  # a pp-number: 1'000, 1e-5f, 0x1p+3
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_." or (text[j] == "'" and text[j + 1:j + 2].isalnum())
                             or (text[j] in "+-" and text[j - 1] in "eEpP")):
                j += 1
            i = j
        elif c.isalpha() or c == "_":
            j = IDENT.match(text, i).end()  # type: ignore[union-attr]
            word = text[i:j]
            if word in ("R", "u8R", "uR", "UR", "LR") and text[j:j + 1] == '"':
                m = re.compile(r'"([^()\\\s"]{0,16})\(').match(text, j)
                end = text.find(")" + m.group(1) + '"', m.end()) if m else -1
                if end < 0:
                    raise Doubt("raw string")
                blank(m.end(), end)  # type: ignore[union-attr]
                i = end + len(m.group(1)) + 2  # type: ignore[union-attr]
            else:
                i = j  # a literal's u8 / L prefix: the quote is handled next
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\n":
                    raise Doubt("newline in a literal")
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise Doubt("unterminated literal")
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


_PAIRS = {")": "(", "]": "[", "}": "{"}


def items(m: str) -> list[tuple[int, int, str]]:
    """Top-level items of masked text: (start, end, "pp") for a directive, (start, end, "decl") for a
    declaration ending in ``;`` or in the ``}`` of a function body."""
    out: list[tuple[int, int, str]] = []
    stack: list[str] = []
    start, i, n, line_start = None, 0, len(m), True
    while i < n:
        c = m[i]
        if c == "\n" or c.isspace():
            line_start = line_start or c == "\n"
            i += 1
            continue
        if c == "#" and line_start:
            j = i
            while j < n and m[j] != "\n":
                j += 2 if m.startswith("\\\n", j) else 1
            if not stack:
                if start is not None:
                    raise Doubt("a directive inside a declaration")
                out.append((i, j, "pp"))
            i = j
            continue
        line_start = False
        if start is None:
            start = i
        if c in "([{":
            stack.append(c)
        elif c in ")]}":
            if not stack or stack.pop() != _PAIRS[c]:
                raise Doubt("unbalanced brackets")
            if c == "}" and not stack and _ends_at_brace(m[start:i + 1]):
                out.append((start, i + 1, "decl"))
                start = None
        elif c == ";" and not stack:
            out.append((start, i + 1, "decl"))
            start = None
        i += 1
    if stack or start is not None:
        raise Doubt("unbalanced or unterminated text")
    return out


def _depth0(text: str, chars: str) -> int:
    """Index of the first of ``chars`` outside brackets in ``text`` (-1: none)."""
    depth = 0
    for k, c in enumerate(text):
        if depth == 0 and c in chars:
            return k
        depth += (c in "([{") - (c in ")]}")
    return -1


def _strip_template(head: str) -> tuple[bool, str]:
    if not re.match(r"\s*template\b", head):
        return False, head
    k, depth = head.index("<"), 0
    for j in range(k, len(head)):
        depth += (head[j] == "<") - (head[j] == ">")
        if depth == 0:
            return True, head[j + 1:]
    raise Doubt("template header")


def _ends_at_brace(item: str) -> bool:
    """A ``}`` at depth 0 ends a function body (or namespace); an initialiser or a type body goes on to ``;``."""
    head = item[:_depth0(item, "{")]
    first = IDENT.findall(_strip_template(head)[1])[:1]
    return _depth0(head, "=") < 0 and not (first and first[0] in _STRUCTURAL)


def _type_names(m: str) -> set[str]:
    """Names a type-like item declares (struct / class / union / enum tags, typedef and using names)."""
    names = set(re.findall(r"\b(?:struct|class|union|enum)\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_]\w*)", m))
    names |= set(re.findall(r"\busing\s+([A-Za-z_]\w*)\s*=", m))
    if re.match(r"\s*typedef\b", m):
        names |= set(re.findall(r"([A-Za-z_]\w*)\s*;\s*$", m))
    return names


def _params(t: str, m: str, types: set[str]) -> tuple[str, list[str]]:
    """A kernel's parameter list, every parameter named (unnamed ones get ``sbx_a<k>``), and the names."""
    parts, depth, last = [], 0, 0
    for k, c in enumerate(m):
        depth += (c in "([{<") - (c in ")]}>")
        if c == "," and depth == 0:
            parts.append((last, k))
            last = k + 1
    parts.append((last, len(m)))
    if len(parts) == 1 and m.strip() in ("", "void"):
        return "", []
    decls, names = [], []
    for k, (a, b) in enumerate(parts):
        pm = m[a:b]
        if depth != 0 or any(s in pm for s in ("=", "(", "...", "&&")):
            raise Doubt("a kernel parameter with a default, a function type or a pack")
        arr = re.search(r"(\s*\[[^\]]*\])+\s*$", pm)
        cut = arr.start() if arr else len(pm.rstrip())
        words = [w for w in IDENT.findall(pm[:cut]) if w not in _CV]
        last_word = re.search(r"([A-Za-z_]\w*)\s*$", pm[:cut])
        named = bool(last_word and last_word.group(1) in words and len(words) >= 2
                     and last_word.group(1) not in _TYPE_WORDS and last_word.group(1) not in types)
        name = last_word.group(1) if named else f"sbx_a{k}"  # type: ignore[union-attr]
        decls.append(t[a:b].strip() if named else f"{t[a:a + cut].strip()} {name}{t[a + cut:b].strip()}")
        names.append(name)
    return ", ".join(decls), names


def signature(mi: str) -> tuple[str, bool, int, int] | None:
    """A function item's name, whether it is a definition, and its parameter list's parentheses (the
    last group before the body or the ``;``: ``__launch_bounds__(...)`` comes before a kernel's name);
    None for anything else."""
    is_def = mi.rstrip().endswith("}")
    head = (mi[:_depth0(mi, "{")] if is_def else mi.rstrip().rstrip(";")).rstrip()
    close, depth, o = len(head) - 1, 0, 0
    for o in range(close, -1, -1):
        depth += (head[o] == ")") - (head[o] == "(")
        if depth == 0:
            break
    name = re.search(r"([A-Za-z_]\w*)\s*$", head[:o]) if head.endswith(")") and depth == 0 else None
    if not name or _depth0(head, "=") >= 0:
        return None
    return name.group(1), is_def, o, close


def prototypes(cpp: str) -> list[str] | None:
    """The functions ``cpp_sources`` declares when it holds only includes, ``#pragma once`` and
    function declarations (what KernelBench answers pass); None otherwise."""
    m, names = mask(cpp), []
    for a, b, kind in items(m):
        mi = m[a:b]
        if kind == "pp":
            if not re.match(r"\s*#\s*(include\b|pragma\s+once\b)", mi):
                return None
            continue
        words = IDENT.findall(mi)
        sig = signature(mi)
        if not mi.strip(" \t\n;"):
            continue
        if (sig is None or sig[1] or not words or words[0] in _STRUCTURAL | {"template", "namespace", "extern", "static"}
                or "{" in mi):
            return None
        names.append(sig[0])
    return names


class Split:
    """The two units of one ``.cu`` (raises :class:`Doubt` when it cannot be split with certainty)."""

    def __init__(self, cuda_source: str) -> None:
        t, m = cuda_source, mask(cuda_source)
        if _NO_SPLIT.search(m) or _NO_SPLIT.search(t):
            raise Doubt("thrust / cub")
        if re.search(r"\b__(?:CUDACC|NVCC)\w*", m):  # nvcc defines them for the .cu's host code, g++ does not
            raise Doubt("code that asks which compiler compiles it")
        self.kernels: dict[str, bool] = {}  # name -> defined
        self._host_items: list[str] = []
        self.device_names: set[str] = set()
        parsed = [(a, b, self._classify(t[a:b], m[a:b], kind)) for a, b, kind in items(m)]
        types = {n for a, b, c in parsed if c == "both" for n in _type_names(m[a:b])}
        device, host = [], []
        for a, b, where in parsed:
            ti, mi = t[a:b], m[a:b]
            if where == "kernel":
                name, is_def, o, close = self._kernel_signature(mi)
                params, names = _params(ti[o + 1:close], mi[o + 1:close], types)
                if is_def and self.kernels.get(name):
                    raise Doubt(f"kernel {name} defined twice (an overload)")
                self.kernels[name] = self.kernels.get(name, False) or is_def
                device.append(ti)
                decl = f"void sbx_launch_{name}(sbx_launch_config sbx_c{', ' if params else ''}{params})"
                if is_def:
                    device.append(f"{decl} {{ {name}<<<sbx_c.grid, sbx_c.block, sbx_c.shmem, sbx_c.stream>>>"
                                  f"({', '.join(names)}); }}")
                host.append(decl + ";")  # where the kernel was: after the types its parameters use
            elif where in ("device", "both"):
                device.append(ti)
            if where in ("host", "both"):
                host.append(ti)
                self._host_items.append(mi)
        if not all(self.kernels.values()):
            raise Doubt("a kernel declared but not defined")
        code = mask("\n".join(device))
        # what torch/types.h would have brought the .cu, where the device code may rely on it
        std = [h for h, used in (("cmath", "std::"), ("algorithm", "std::"), ("limits", "std::"), ("utility", "std::"),
                                 ("type_traits", "std::"), ("cfloat", "FLT_"), ("climits", "INT_")) if used in code]
        self.device = ("#include <cuda.h>\n#include <cuda_runtime.h>\n" + "".join(f"#include <{h}>\n" for h in std)
                       + CONFIG_STRUCT + "\n".join(device) + "\n")
        self.host = "#include <cuda.h>\n#include <cuda_runtime.h>\n" + CONFIG_STRUCT + self._rewrite("\n".join(host)) + "\n"

    @staticmethod
    def _kernel_signature(mi: str) -> tuple[str, bool, int, int]:
        sig = signature(mi)
        if sig is None or sig[0] == "__launch_bounds__":
            raise Doubt("a __global__ item that is not a plain function")
        return sig

    def _classify(self, ti: str, mi: str, kind: str) -> str | None:
        """Where one item goes: "host", "device", "both", "kernel" or None (nothing)."""
        if kind == "pp":
            if re.match(r"\s*#\s*define\b", mi) and ("<<<" in mi or _QUALIFIERS.search(mi)):
                raise Doubt("a macro holding a launch or a CUDA qualifier")
            return "host" if _TORCH_INCLUDE.match(ti.strip()) else "both"
        if not mi.strip(" \t\n;"):
            return None
        words = set(IDENT.findall(mi))
        first = IDENT.findall(mi)[:1]
        if first and (first[0] in ("namespace", "asm") or (first[0] == "extern" and '"' in mi)):
            raise Doubt("namespaces and extern \"C\" are not split")
        is_template, rest = _strip_template(mi)
        torchy = bool(_TORCH.search(mi))
        if "__global__" in words:
            if is_template or torchy or "<<<" in mi:
                raise Doubt("a templated kernel, torch in a kernel, or a launch from a kernel")
            return "kernel"
        if IDENT.findall(rest)[:1] and IDENT.findall(rest)[0] in _STRUCTURAL:
            if "<<<" in mi:
                raise Doubt("a launch inside a type")
            return "host" if torchy else "both"
        if words & _DEVICE_WORDS:
            if "__managed__" in words or torchy or "<<<" in mi:
                raise Doubt("managed memory, torch in device code, or a launch from the device")
            head = mi[:_depth0(mi, "{")] if mi.rstrip().endswith("}") else mi
            eq, paren = _depth0(head, "="), _depth0(head, "(")
            if not (paren >= 0 and (eq < 0 or paren < eq)):  # a device variable: the host may not name it
                self.device_names |= {w for w in IDENT.findall(head[:eq] if eq >= 0 else head)
                                      if w not in _TYPE_WORDS and w not in _DEVICE_WORDS and w not in ("static", "extern")}
            return "device"
        head = mi[:_depth0(mi, "{")] if mi.rstrip().endswith("}") else mi
        eq, paren = _depth0(head, "="), _depth0(head, "(")
        is_function = paren >= 0 and (eq < 0 or paren < eq)
        if is_function and "constexpr" in words and not torchy and "<<<" not in mi:
            return "both"  # kernels may call constexpr host functions (torch passes --expt-relaxed-constexpr)
        if not is_function and words & {"const", "constexpr"} and "extern" not in words and not torchy:
            return "both"  # a constant: internal linkage, usable by kernels and host code alike
        return "host"

    def declared_before_use(self, name: str) -> bool:
        """Whether the first host item naming ``name`` declares or defines it as a function: then a
        declaration of it placed before this unit's host code changes nothing (sandbox/split_cuda.py)."""
        first = next((mi for mi in self._host_items if name in IDENT.findall(mi)), None)
        sig = signature(first) if first is not None else None
        return sig is not None and sig[0] == name

    def _rewrite(self, host: str) -> str:
        """Every ``kernel<<<cfg>>>(args)`` of the host text as a call of its stub; Doubt on anything else
        that names a kernel or a device variable."""
        m = mask(host)
        out, last = [], 0
        for hit in re.finditer(r"<<<", m):
            if hit.start() < last:
                raise Doubt("a launch inside a launch")
            name = re.search(r"(?:(::|\.|->|>)\s*)?([A-Za-z_]\w*)\s*$", m[last:hit.start()])
            if not name or name.group(1) or name.group(2) not in self.kernels:
                raise Doubt("a launch of something other than a kernel of this file")
            end = self._close(m, hit.end())
            args = re.compile(r"\s*\(").match(m, end + 3)
            if not args:
                raise Doubt("a launch without arguments")
            close = args.end() + _depth0(m[args.end():], ")")
            if close < args.end():
                raise Doubt("unbalanced launch arguments")
            cfg, arg_text = host[hit.end():end], host[args.end():close]
            sep = ", " if m[args.end():close].strip() else ""
            out += [host[last:last + name.start(2)],
                    f"sbx_launch_{name.group(2)}(sbx_launch_config({cfg}){sep}{arg_text})"]
            last = close + 1
        out.append(host[last:])
        text = "".join(out)
        code = set(IDENT.findall(mask(text)))
        if code & (set(self.kernels) | self.device_names) or _QUALIFIERS.search(mask(text)) or _SYMBOL_APIS.search(text):
            raise Doubt("host code names a kernel or a device symbol other than at a launch")
        return text

    @staticmethod
    def _close(m: str, k: int) -> int:
        """Index of the ``>>>`` closing a launch configuration that starts at ``k``."""
        depth = 0
        while k < len(m):
            if depth == 0 and m.startswith(">>>", k):
                return k
            if depth == 0 and (m.startswith(">>", k) or m.startswith("<<", k) or m[k] in ";{}"):
                raise Doubt("a shift or a statement in a launch configuration")
            depth += (m[k] in "([") - (m[k] in ")]")
            k += 1
        raise Doubt("unterminated launch configuration")
