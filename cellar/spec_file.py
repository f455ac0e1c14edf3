"""Reading a cluster configuration from a TOML or JSON file, for `cellar admin apply-config`.

The file uses the field names of `statemachine.spec` (gpu_models, cell_types, physical_cells,
virtual_clusters, policy); `node_level`, `on_failure`, `quota` and `policy` may be left out.
Errors name the path inside the file, as the state machine's decoder does.
"""

from __future__ import annotations

import json
import pathlib
import tomllib
from typing import Any

from statemachine.record_codec import DecodeError, Record
from statemachine.spec import ClusterSpec
from statemachine.spec_codec import decode_spec

SPEC_FIELDS = ("gpu_models", "cell_types", "physical_cells", "virtual_clusters", "policy")


class SpecFileError(Exception):
    """The file cannot be read, or is not a valid cluster configuration."""


def load_spec(path: pathlib.Path) -> ClusterSpec:
    try:
        text = path.read_text(encoding="utf-8")
        raw: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as error:
        raise SpecFileError(f"{path}: cannot read it ({error.strerror})") from error
    except (ValueError, tomllib.TOMLDecodeError, RecursionError) as error:  # nested too deep
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise SpecFileError(f"{path}: not valid {kind} ({error})") from error
    try:
        return decode_spec(Record(with_defaults(raw), "spec", SPEC_FIELDS))
    except DecodeError as error:
        raise SpecFileError(f"{path}: {error}") from error


def with_defaults(raw: Any) -> Any:
    if not isinstance(raw, dict):
        return raw
    filled = dict(raw)
    filled.setdefault("policy", {})
    filled["cell_types"] = _each_with(raw.get("cell_types", []), {"node_level": False})
    filled["virtual_clusters"] = _each_with(raw.get("virtual_clusters", []),
                                            {"on_failure": "keep", "quota": []})
    return filled


def _each_with(items: Any, defaults: dict[str, Any]) -> Any:
    """Each map of the list `items` with `defaults` under it. Anything but a list is left as
    it is, for the decoder to refuse by name (iterating `cell_types = 3` raised TypeError)."""
    if not isinstance(items, list):
        return items
    return [{**defaults, **item} if isinstance(item, dict) else item for item in items]
