"""Device headers are pure (docs/architecture.md): csrc/kernels, csrc/common and csrc/nvshmem
take plain structs and hold no pybind11, no std::string, no string literals (a host helper there
returns an error code; csrc/bindings turns it into words) and no config key names. PTX in
``asm(...)`` and ``#include "..."`` lines are the only strings allowed. CPU only."""
from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from symmoe import config

CSRC = Path(__file__).resolve().parent.parent / "csrc"
DEVICE_DIRS = ("kernels", "common", "nvshmem")
HEADERS = sorted(p for d in DEVICE_DIRS for p in (CSRC / d).iterdir() if p.suffix in (".cuh", ".h"))


def _config_keys() -> list[str]:
    """Every config key with its section (``kernel.num_sms``, ``buffer.hidden``, ...)."""
    hints = typing.get_type_hints(config.Config)
    keys = []
    for f in dataclasses.fields(config.Config):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(hints[f.name])]
    return keys


def _blank(text: str, start: int, end: int) -> str:
    """text with [start, end) replaced by spaces, its newlines kept (line numbers stay)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def _code(text: str) -> str:
    """text with its comments blanked (string and char literals kept, so a "//" inside a string
    is no comment)."""
    out, i, n = text, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out, i = _blank(out, i, j), j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out, i = _blank(out, i, j), j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def _without_allowed(code: str) -> str:
    """code with ``asm(...)`` statements (PTX strings and operand constraints) and ``#include``
    lines blanked."""
    for m in reversed(list(re.finditer(r"\basm\b(\s+volatile\b)?\s*\(", code))):
        depth, j = 0, m.end() - 1
        while j < len(code):
            if code[j] == '"':  # skip the string: its parentheses do not count
                j += 1
                while code[j] != '"':
                    j += 2 if code[j] == "\\" else 1
            elif code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        code = _blank(code, m.start(), j + 1)
    return re.sub(r"(?m)^[ \t]*#[ \t]*include[^\n]*", lambda m: " " * len(m.group(0)), code)


def impurities(text: str, keys: typing.Sequence[str] = ()) -> list[tuple[int, str]]:
    """(line, what) for each thing a device header must not hold."""
    found = []
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    code = _code(text)
    for m in re.finditer(r"pybind11", code):
        found.append((line_of(m.start()), "pybind11"))
    for m in re.finditer(r"(?m)^[ \t]*#[ \t]*include[ \t]*<string>", code):
        found.append((line_of(m.start()), "#include <string>"))
    for m in re.finditer(r"\bstd::string\b", code):
        found.append((line_of(m.start()), "std::string"))
    for m in re.finditer(r'"(?:\\.|[^"\\\n])*"', _without_allowed(code)):
        found.append((line_of(m.start()), f"string literal {m.group(0)[:40]}"))
    for key in keys:  # comments too: a device header takes plain values, whatever config they came from
        for m in re.finditer(rf"\b{re.escape(key)}\b", text):
            found.append((line_of(m.start()), f"config key {key}"))
    return sorted(set(found))


def test_the_scan_finds_what_it_must_and_allows_ptx_and_includes():
    text = '\n'.join([
        '#include "ptx.cuh"',
        '#include <string>',
        '// a comment may say "anything" and name pybind11',
        'asm volatile("{\\n .reg .pred p;\\n}\\n" : "=r"(ok) : "r"(x) : "memory");',
        'asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));',
        'const char* e = "refused";  // kernel.num_sms',
        'std::string s;',
        "char q = '\"';",
        '#include <pybind11/pybind11.h>',
    ])
    assert impurities(text, ["kernel.num_sms"]) == [
        (2, "#include <string>"), (6, "config key kernel.num_sms"), (6, 'string literal "refused"'),
        (7, "std::string"), (9, "pybind11")]


def test_the_device_folders_hold_headers():
    assert len(HEADERS) > 10 and {p.parent.name for p in HEADERS} == set(DEVICE_DIRS)


@pytest.mark.parametrize("header", HEADERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_device_header_holds_no_strings_pybind11_or_config_names(header):
    found = impurities(header.read_text(), _config_keys())
    rel = header.relative_to(CSRC.parent)
    assert not found, "\n".join(f"{rel}:{line}: {what}" for line, what in found)
