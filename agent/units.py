"""Byte units the agent's readings and limits are written in, defined once."""

from __future__ import annotations

from typing import Final

MIB: Final = 1 << 20
