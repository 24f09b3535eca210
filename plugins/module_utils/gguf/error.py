# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one exception of the GGUF reader: every malformed input raises ``GGUFError(path, offset, reason)``.

Standard library only; runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations


class GGUFError(Exception):
    """A GGUF file that cannot be read: ``str()`` is ``"<path>: at byte <offset>: <reason>"``."""

    def __init__(self, path, offset, reason):
        self.path = str(path)
        self.offset = int(offset)
        self.reason = str(reason)
        super().__init__(self.path, self.offset, self.reason)

    def __str__(self):
        return f"{self.path}: at byte {self.offset}: {self.reason}"
