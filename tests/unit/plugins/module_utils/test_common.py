"""The small jobs of _common: hashing, reading a file, integers, MiB and cutting text, at their boundaries."""
from __future__ import annotations

import hashlib

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import (
    MIB,
    as_int,
    mib,
    mib_text,
    read_bytes,
    sha256_hex,
    shorten,
)


def test_sha256_hex_is_the_hex_digest_and_none_for_no_file():
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_hex(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert sha256_hex(None) is None


def test_read_bytes_reads_the_file_and_gives_none_for_a_missing_one(tmp_path):
    (tmp_path / "f").write_bytes(b"\x00ab\n")
    assert read_bytes(str(tmp_path / "f")) == b"\x00ab\n"
    assert read_bytes(tmp_path / "missing") is None
    # a directory is None only when ``missing`` says so
    with pytest.raises(IsADirectoryError):
        read_bytes(tmp_path)
    assert read_bytes(tmp_path, missing=(OSError,)) is None
    assert read_bytes(tmp_path / "missing", missing=(OSError,)) is None


@pytest.mark.parametrize("value, options, expected", [
    (0, {}, 0), (-3, {}, -3), (2 ** 70, {}, 2 ** 70), (4.0, {}, 4), (-0.0, {}, 0), (4.5, {}, None),
    (float("nan"), {}, None), (float("inf"), {}, None), (True, {}, None), (False, {}, None), (None, {}, None),
    ("4", {}, None), ([4], {}, None),
    # the default stands for what is not an integer
    (None, {"default": -1}, -1), (True, {"default": 7}, 7), (2.5, {"default": 0}, 0), (3, {"default": 0}, 3),
    # bool_as_int counts a bool as 0 or 1
    (True, {"default": -1, "bool_as_int": True}, 1), (False, {"default": -1, "bool_as_int": True}, 0),
    (True, {"bool_as_int": True}, 1),
    # whole_floats=False refuses every float
    (4.0, {"default": -1, "whole_floats": False}, -1), (4.5, {"default": -1, "whole_floats": False}, -1),
    (4, {"default": -1, "whole_floats": False}, 4), (True, {"default": -1, "bool_as_int": True, "whole_floats": False}, 1),
])
def test_as_int_takes_ints_and_whole_floats_only(value, options, expected):
    got = as_int(value, **options)
    assert got == expected
    assert got is None if expected is None else isinstance(got, int) and not isinstance(got, bool)


def test_mib_rounds_to_hundredths_of_a_mib_and_mib_text_defaults_to_one_decimal_and_no_unit():
    assert MIB == 1048576
    assert mib(0) == 0.0
    assert mib(MIB) == 1.0
    assert mib(MIB + 5242) == 1.0        # 1.004999...
    assert mib(MIB + 5243) == 1.01       # 1.005000...
    assert mib(3 * MIB // 2) == 1.5
    assert mib(-MIB) == -1.0
    assert mib_text(24148) == "24,148.0"


@pytest.mark.parametrize("value,decimals,unit,expected", [
    (None, 1, "", "-"), (None, 0, " MiB", "-"),          # not known: a dash, whatever the format
    (0, 1, "", "0.0"), (1234.56, 1, "", "1,234.6"), (1234567.0, 0, "", "1,234,567"),
    (999.95, 1, "", "1,000.0"), (-2048.25, 2, " MiB", "-2,048.25 MiB"), (12, 0, " MiB", "12 MiB"),
    (1234567.89, 1, "", "1,234,567.9"),   # rollout.md: thousands separated, one decimal
    (2375.25, 1, "", "2,375.2"),
    (0.4, 0, " MiB", "0 MiB"),            # rollout.html: whole MiB with the unit
    (1234.6, 0, " MiB", "1,235 MiB"),
])
def test_mib_text_separates_thousands_and_ends_with_the_unit(value, decimals, unit, expected):
    assert mib_text(value, decimals, unit) == expected


@pytest.mark.parametrize("text,limit,marker,expected", [
    ("abcdef", 6, "...", "abcdef"),       # limit equal to the length: unchanged
    ("abcdefg", 6, "...", "abc..."),      # one over: start and marker, limit in all
    ("abcdefg", 3, "...", "..."),         # limit equal to the marker
    ("abcdefg", 2, "...", "..."),         # marker longer than the limit: the marker alone
    ("abcdefg", 0, "", ""), ("abcdefg", 4, " [cut]", " [cut]"), ("abcdefg", 5, "~", "abcd~"), (None, 5, "...", ""),
    (12345678, 5, "..", "123.."),
])
def test_shorten_keeps_text_within_the_limit_with_its_marker(text, limit, marker, expected):
    assert shorten(text, limit, marker) == expected
