"""What a crash of llama-server means (``_llama_crash``): the signal behind an exit code. The crash lines themselves
are found by the log parser: tests/unit/plugins/module_utils/test_llama_log.py."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_crash import signal_of_exit_code


@pytest.mark.parametrize("code, signal", [(0, None), (1, None), (2, None), (127, None), (128, None), (160, None), (255, None),
                                          (None, None), (129, 1), (134, 6), (137, 9), (139, 11), (159, 31), (-9, 9), (-1, 1)])
def test_a_shell_s_128_plus_n_and_python_s_minus_n_name_signal_n(code, signal):
    assert signal_of_exit_code(code) == signal
