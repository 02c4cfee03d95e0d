"""docs/config.md is generated from the config's dataclasses: it must match them, and every
key must say what it does. CPU only."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

from symmoe import config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_docs_config_md_is_up_to_date():
    want = config.reference_markdown()
    assert DOC.read_text() == want, (f"docs/config.md is out of date with symmoe/config.py; regenerate it: "
                                     f"{config.REFERENCE_COMMAND}")


def test_every_key_has_a_description_and_every_section_a_docstring():
    def walk(cls: type, path: str):
        hints = typing.get_type_hints(cls)
        assert (cls.__doc__ or "").strip() and not cls.__doc__.startswith(cls.__name__ + "("), cls.__name__
        for f in dataclasses.fields(cls):
            if f.name == "source":
                continue
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{path}{f.name}.")
            else:
                assert f.metadata.get("doc"), f"{path}{f.name} has no description"

    walk(config.Config, "")


def test_every_key_and_default_is_in_the_reference():
    md = config.reference_markdown()
    flat = config.Config().to_dict()
    for section, keys in flat.items():
        for key, default in (keys.items() if isinstance(keys, dict) else [(None, keys)]):
            kp = section if key is None else f"{section}.{key}"
            assert f"| `{kp}` |" in md, kp


def test_the_cli_prints_the_reference():
    out = subprocess.run([sys.executable, "-m", "symmoe.cli", "config", "docs"], capture_output=True, text=True,
                         check=True).stdout
    assert out == config.reference_markdown()
