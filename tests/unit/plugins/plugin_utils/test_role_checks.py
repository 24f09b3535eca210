"""One variable checked as its option in the argument spec declares it (plugins/plugin_utils/_role_checks.py): the
check follows the option's type, list elements and choices, with the ranges and formats its caller gives; one
message per variable, the first. The role's own variables and their messages: test_role_variables.py."""
from __future__ import annotations

import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_checks import Checker

# Options as an argument spec declares them: what the checks read of each.
OPTIONS = {
    "count": {"type": "int", "default": 1},
    "share": {"type": "float", "default": None},
    "flag": {"type": "bool", "default": False},
    "word": {"type": "str", "choices": ["a", "b"], "default": "a"},
    "name": {"type": "str", "default": "x"},
    "text": {"type": "str", "default": ""},
    "where": {"type": "path", "default": "/srv"},
    "ids": {"type": "list", "elements": "int", "default": []},
    "args": {"type": "list", "elements": "str", "default": []},
    "blob": {"type": "raw", "default": None},
}


def checked(name, value, **rule):
    """``(the value kept, the problems)`` of ``name`` given ``value``."""
    checker = Checker({name: value}, OPTIONS)
    return checker.check(name, **rule), checker.problems


@pytest.mark.parametrize("name, value, rule, kept", [
    ("count", " 7 ", {"low": 1, "high": 9}, 7),
    ("share", "0.5", {}, 0.5),
    ("flag", "yes", {}, True),
    ("word", "b", {}, "b"),
    ("name", "ab1", {"regex": re.compile("^[a-z0-9]+$"), "what": "a name"}, "ab1"),
    ("text", "a\tb", {"allow_control": True}, "a\tb"),
    ("where", "/srv//x/", {"mounted": True}, "/srv/x"),
    ("ids", "3,1", {"low": 0, "high": 3}, [3, 1]),
    ("args", ["-n", 4], {}, ["-n", "4"]),
    # an empty value where the rule allows one, and a check named by the rule instead of the type's
    ("count", "", {"low": 1, "high": 9, "empty": True}, None),
    ("name", " all ", {"check": "gpu_layers"}, "all"),
    ("word", "/m", {"check": "path"}, "/m"),
])
def test_the_check_follows_the_options_type_elements_and_choices(name, value, rule, kept):
    assert checked(name, value, **rule) == (kept, [])


@pytest.mark.parametrize("name, value, rule, message", [
    ("count", 10, {"low": 1, "high": 9}, "10 is out of range: an integer from 1 to 9"),
    ("count", "", {"low": 1, "high": 9}, '"" is not an integer from 1 to 9'),
    ("share", 2, {}, "2 is not a share above 0 and at most 1 (for example 0.9), or empty"),
    ("flag", "y", {}, "'y' is not a boolean"),
    ("word", "c", {}, '"c" is not one of "a", "b"'),
    ("name", "A", {"regex": re.compile("^[a-z0-9]+$"), "what": "a name"}, '"A" is not a name'),
    ("text", "a\tb", {}, '"a\\tb" holds control characters (\\t)'),
    ("where", "/srv/a:b", {"mounted": True}, "\"/srv/a:b\" holds ':' or ',', which a compose bind mount cannot carry"),
    ("ids", [4], {"low": 0, "high": 3}, "4 is out of range: integers from 0 to 3"),
    ("args", "-n", {}, "'-n' is not a list of strings"),
])
def test_a_value_the_check_refuses_is_named_with_its_message(name, value, rule, message):
    assert checked(name, value, **rule) == (None, [(name, message)])


def test_an_integer_needs_its_range_and_a_type_without_a_check_is_an_error():
    with pytest.raises(TypeError, match="'low' and 'high'"):
        checked("count", 1)
    with pytest.raises(KeyError, match="raw"):
        checked("blob", 1)


def test_the_checker_keeps_the_first_message_of_a_variable_and_a_missing_value_is_an_error():
    checker = Checker({}, OPTIONS)
    assert checker.fail("a", "first") is None
    checker.fail("b", "other")
    checker.fail("a", "second")
    assert checker.problems == [("a", "first"), ("b", "other")]
    with pytest.raises(KeyError, match="count has no value"):
        checker.check("count", low=1, high=9)
