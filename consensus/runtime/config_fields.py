"""Reading a TOML configuration file key by key, with errors that name the key and the reason.

Replica and node-agent configurations share these readers, so both refuse a bad file the same
way (`peers[1].client: "localhost" is not HOST:PORT`) before anything starts.
"""

from __future__ import annotations

import pathlib
import tomllib
from dataclasses import dataclass
from typing import Any

from consensus.errors import ConsensusError


class ConfigError(ConsensusError):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


def load_toml(path: pathlib.Path, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as failure:
        raise error(f"{path}: cannot read it ({failure.strerror})") from failure
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as failure:
        raise error(f"{path}: not valid TOML ({failure})") from failure


def refuse_unknown(raw: dict[str, Any], known: set[str], where: str = "",
                   error: type[ConfigError] = ConfigError) -> None:
    for key in sorted(set(raw) - known):
        raise error(f"{where}{key}: unknown key (expected one of {', '.join(sorted(known))})")


def text(raw: dict[str, Any], key: str, *, where: str = "", default: str | None = None,
         error: type[ConfigError] = ConfigError) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise error(f"{where}{key}: required, a non-empty string")
    return value


def choice(raw: dict[str, Any], key: str, choices: tuple[str, ...], *, default: str,
           error: type[ConfigError] = ConfigError) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise error(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return str(value)


def integer(raw: dict[str, Any], key: str, low: int, high: int, *, where: str = "",
            default: int | None = None, error: type[ConfigError] = ConfigError) -> int:
    value = raw.get(key, default)
    if type(value) is not int:
        raise error(f"{where}{key}: required, an integer")
    if not low <= value <= high:
        raise error(f"{where}{key}: {value} is outside [{low}, {high}]")
    return value


def flag(raw: dict[str, Any], key: str, *, default: bool, where: str = "",
         error: type[ConfigError] = ConfigError) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise error(f"{where}{key}: must be true or false")
    return value


def address(value: Any, key: str, error: type[ConfigError] = ConfigError) -> Address:
    if not isinstance(value, str) or value.count(":") < 1:
        raise error(f"{key}: {value!r} is not HOST:PORT")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")  # "[]:9400" had left "", which listens on every interface
    # isdigit() alone admits digits int() refuses ("²"), which escaped as a ValueError
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise error(f"{key}: {value!r} is not HOST:PORT with a port in 1..65535")
    return Address(host, int(port))


def security(raw: dict[str, Any], base: pathlib.Path,
             error: type[ConfigError] = ConfigError) -> tuple[bool, TlsFiles | None]:
    """`insecure` and the `[tls]` files of a config file: exactly one of them. Both together
    are refused (as `tls.check_security` refuses the pair): the table had been dropped without
    a word, and the process served plain TCP to an operator who wrote where its certificates
    are."""
    insecure = flag(raw, "insecure", default=False, error=error)
    if insecure and "tls" in raw:
        raise error("insecure: true beside a [tls] table: choose one (plain TCP for local "
                    "development only, or the [tls] files)")
    return insecure, None if insecure else tls_files(raw.get("tls"), base, error)


def tls_files(value: Any, base: pathlib.Path,
              error: type[ConfigError] = ConfigError) -> TlsFiles:
    if not isinstance(value, dict):
        raise error("tls: required unless insecure = true (a table with ca, cert, key); make "
                    "them with `cellar certs init`")
    refuse_unknown(value, {"ca", "cert", "key"}, "tls.", error)  # a key written below [tls]
    files = {}
    for key in ("ca", "cert", "key"):
        name = value.get(key)
        if not isinstance(name, str):
            raise error(f"tls.{key}: required, a file path")
        path = base / name
        if not path.is_file():
            raise error(f"tls.{key}: {path} does not exist")
        files[key] = path
    return TlsFiles(files["ca"], files["cert"], files["key"])
