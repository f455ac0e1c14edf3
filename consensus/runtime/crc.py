"""crc32 of a concatenation from the crc32 of its parts: zlib's `crc32_combine`, which Python's
zlib module does not expose.

The record log checks a frame as crc32(length + payload). To ask "would the frame at this offset
be valid if its length were n?" for many n, the reader extends one running crc32 of the payload
and combines it with crc32(length) for each n: a few microseconds each, where recomputing the
whole checksum would cost time proportional to n for every candidate.

The method is zlib's: appending a zero byte to a message is a linear map of its crc register
(a 32 x 32 matrix over GF(2)); the maps for 1, 2, 4, ... zero bytes are squares of each other,
and `combine(a, b, len_b)` applies `len_b` zero bytes to `a` and adds `b`. The final xor of
crc32 cancels between the two terms, so it works on finished checksums.
"""

from __future__ import annotations

import functools

POLYNOMIAL = 0xEDB88320  # crc32's, reflected
LENGTH_BITS_MAX = 64  # combine() takes a second part of up to 2**64 - 1 bytes


def _times(matrix: tuple[int, ...], vector: int) -> int:
    total, column = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[column]
        vector >>= 1
        column += 1
    return total


def _square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_times(matrix, column) for column in matrix)


@functools.cache
def _zero_bytes_operators() -> tuple[tuple[int, ...], ...]:
    """The maps of 2**k zero bytes, k = 0, 1, ..., LENGTH_BITS_MAX - 1 (built once, on use)."""
    operator = (POLYNOMIAL, *(1 << bit for bit in range(31)))  # one zero bit
    for _ in range(3):  # 2, 4, then 8 zero bits: one zero byte
        operator = _square(operator)
    operators = [operator]
    for _ in range(LENGTH_BITS_MAX - 1):
        operators.append(_square(operators[-1]))
    return tuple(operators)


def crc32_combine(first: int, second: int, second_bytes: int) -> int:
    """zlib.crc32(a + b) from zlib.crc32(a), zlib.crc32(b) and len(b)."""
    assert 0 <= second_bytes < 1 << LENGTH_BITS_MAX, second_bytes
    operators = _zero_bytes_operators()
    power = 0
    while second_bytes:
        if second_bytes & 1:
            first = _times(operators[power], first)
        second_bytes >>= 1
        power += 1
    return first ^ second
