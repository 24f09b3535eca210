# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GGUF reader (llama.cpp's model format): headers only, never tensor data; standard library only, it runs on
the target hosts (Python >= 3.9).

Its parts, each imported from its own module:

* ``model``: a model, one file or every shard of a split model (``read_model``, ``GGUFModel``);
* ``header``: the header of one file, its metadata and tensor infos (``read_gguf``, ``GGUFFile``, ``TensorInfo``);
* ``values``: bounded reading of the metadata's scalars, strings and arrays (``ValueReader``, ``SkippedArray``);
* ``keys``: the metadata keys the collection reads, named as gguf-py names them;
* ``types``: the ggml tensor types and the bytes a tensor of each takes;
* ``error``: ``GGUFError``, the one exception every part raises for a malformed file.
"""
