# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llama.cpp build this collection models: the memory and speed rules of the planner, the log formats of the
proof and the start command were read from its sources, and the tests run a llama-server of this build."""
from __future__ import annotations

BUILD = 10435            # llama.cpp's tag b10435
COMMIT = "9e40df63b"     # the commit of that tag, as llama-server prints it ("build 10435 (9e40df63b)")
