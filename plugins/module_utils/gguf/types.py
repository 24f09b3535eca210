# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ggml tensor types a GGUF file names, and the bytes a tensor of each takes.

Standard library only: this runs on target hosts (Python >= 3.9).

* ``GGML_TYPES``: the tensor types (ggml/include/ggml.h ``enum ggml_type``, block sizes from
  ggml/src/ggml.c ``type_traits``), ``REMOVED_TYPE_IDS`` / ``REMOVED_TYPE_NAMES`` the ids ggml dropped,
  ``PLAIN_TYPE_IDS`` those that are not block-quantized, ``type_name`` and ``tensor_nbytes``;
* ``GGML_MAX_DIMS`` / ``GGML_MAX_NAME``: ggml's bounds on a tensor's dimensions and name.
"""

from __future__ import annotations

# ggml tensor types: id -> (name, elements per block, bytes per block).
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
# Ids ggml removed (ggml/include/ggml.h keeps them as comments in enum ggml_type; ggml/src/ggml.c type_traits
# gives them blck_size 0): llama.cpp's loader refuses files that still use them. New ids keep appearing: an id
# in neither table is "size unknown".
REMOVED_TYPE_NAMES = {
    4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",
}
REMOVED_TYPE_IDS = frozenset(REMOVED_TYPE_NAMES)
# Types that are not block-quantized (floats and integers): CUDA pads only quantized rows.
PLAIN_TYPE_IDS = frozenset(t for t, (_name, block, _size) in GGML_TYPES.items() if block == 1)

# ggml/include/ggml.h GGML_MAX_DIMS: a tensor has at most this many dimensions.
GGML_MAX_DIMS = 4
# ggml/include/ggml.h GGML_MAX_NAME: a tensor name holds fewer bytes (ggml/src/gguf.cpp gguf_init_from_file_impl
# refuses a longer one: "tensor name ... is too long").
GGML_MAX_NAME = 64


def type_name(type_id):
    """The ggml name of a tensor type id, ``"unknown(N)"`` for ids not in ``GGML_TYPES``."""
    entry = GGML_TYPES.get(type_id)
    return entry[0] if entry else f"unknown({type_id})"


def tensor_nbytes(type_id, shape):
    """Bytes of a tensor of ggml type ``type_id`` and shape ``shape`` (ggml ``ne`` order).

    ``None`` when the type id is unknown (size unknown). ``ValueError`` when ``ne0`` is not a multiple
    of the type's block size.
    """
    entry = GGML_TYPES.get(type_id)
    if entry is None:
        return None
    name, block, block_bytes = entry
    ne0 = shape[0] if shape else 1
    if ne0 % block:
        raise ValueError(f"ne0 = {ne0} is not a multiple of the {name} block size {block}")
    rows = 1
    for n in shape[1:]:
        rows *= n
    return ne0 // block * block_bytes * rows
