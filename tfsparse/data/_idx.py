"""Reading the IDX files MNIST is distributed in (big-endian header + raw bytes).

An IDX file starts with a 4-byte magic number: two zero bytes, a type code
(0x08 for unsigned bytes) and the number of dimensions, followed by one
big-endian uint32 per dimension and then the data in row-major order.
"""

import gzip
import math
import pathlib
import struct

import numpy as np

_UNSIGNED_BYTE = 0x08


def read_idx(path, expected_ndim):
    """Returns the uint8 array stored in an IDX file (``.gz`` is decompressed).

    Args:
        path: the IDX file, optionally gzip-compressed (name ending in ``.gz``).
        expected_ndim: the number of dimensions the file must have (3 for
            images, 1 for labels).

    Returns:
        A ``np.uint8`` array of the stored shape.

    Raises:
        ValueError: if the header or the length of the file is not that of an
            unsigned-byte IDX file with ``expected_ndim`` dimensions.
    """
    path = pathlib.Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as stream:
            content = stream.read()
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"Cannot read the IDX file '{path}': {error}") from error
    if len(content) < 4:
        raise ValueError(
            f"Malformed IDX file '{path}': expected at least a 4-byte header. "
            f"Received: {len(content)} bytes."
        )
    zero_0, zero_1, type_code, ndim = content[:4]
    if (zero_0, zero_1, type_code, ndim) != (0, 0, _UNSIGNED_BYTE, expected_ndim):
        raise ValueError(
            f"Malformed IDX file '{path}': expected the magic number "
            f"0x0000{_UNSIGNED_BYTE:02x}{expected_ndim:02x} (unsigned bytes, "
            f"{expected_ndim} dimensions). Received: 0x{content[:4].hex()}."
        )
    header_size = 4 + 4 * ndim
    if len(content) < header_size:
        raise ValueError(
            f"Malformed IDX file '{path}': the header of {ndim} dimensions needs "
            f"{header_size} bytes. Received: {len(content)} bytes."
        )
    shape = struct.unpack(f">{ndim}I", content[4:header_size])
    expected_size = header_size + math.prod(shape)  # Python ints: no int64 wrap at 2**63
    if len(content) != expected_size:
        raise ValueError(
            f"Malformed IDX file '{path}': a shape of {shape} needs "
            f"{expected_size} bytes. Received: {len(content)} bytes."
        )
    data = np.frombuffer(content, dtype=np.uint8, offset=header_size)
    return data.reshape(shape).copy()  # a writable array the caller owns
