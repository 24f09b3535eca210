"""plugins/module_utils/_cuda_requirement.py: NVIDIA_REQUIRE_CUDA as libnvidia-container evaluates it
(src/cli/dsl.c ``dsl_evaluate``, ``dsl_compare_version``; src/cli/configure.c ``check_*``)."""
import json
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_requirement import (
    VARIABLE, RequirementError, allowed_branches, compare_version, hook_brand, parse, parse_image_env, read, refusal,
    refusals, satisfied)
from tests.helpers.cuda_image import REQUIRE_12_8_1


def test_the_real_string_has_its_published_shape():
    alternatives = parse(REQUIRE_12_8_1)
    assert alternatives[0] == [("cuda", ">=", "12.8")]
    assert len(alternatives) == 1 + 5 * 12
    assert alternatives[1] == [("brand", "=", "unknown"), ("driver", ">=", "470"), ("driver", "<", "471")]
    assert "brand=geforce" not in REQUIRE_12_8_1 and "brand=nvidia,driver>=550,driver<551" in REQUIRE_12_8_1


@pytest.mark.parametrize("left, op, right, expected", [
    ("12.8", ">=", "12.8", True), ("12.8.0", "=", "12.8", True), ("12.6", ">=", "12.8", False),
    ("12.10", ">", "12.9", True),                      # numbers, not strings
    ("550.127.05", ">=", "550", True), ("550.127.05", "<", "551", True), ("551", "<", "551", False),
    ("560.35.03", "<", "561", True), ("560.35.03", ">=", "565", False), ("12.8", "!=", "12.8.0", False),
    ("13.0", "<=", "12.9", False), ("8.6", ">=", "7.5", True),
])
def test_versions_compare_number_by_number(left, op, right, expected):
    assert compare_version(left, op, right) is expected


@pytest.mark.parametrize("bad", ["cuda>=12.8a", "cuda=>12.8", "cuda>=", ">=12.8", "vram>=8", "brand>tesla",
                                 "cuda>=12,8x"])
def test_invalid_expressions_are_refused_with_the_condition(bad):
    with pytest.raises(RequirementError):
        satisfied(bad, {"cuda": "12.4", "driver": "550.127.05", "brand": "Tesla", "arch": "8.6"})


def test_names_compare_without_case_and_empty_pieces_are_skipped():
    assert parse("  CUDA>=12.8,,  Brand=Tesla ") == [[("cuda", ">=", "12.8")], [("brand", "=", "Tesla")]]
    assert satisfied("", {"cuda": "11.0"}) and satisfied("   ", {"cuda": "11.0"})


# The facts of the fixtures' cards: nvidia-smi's driver_version (tests/data/nvidia_smi), the driver's CUDA version
# (nvidia-smi's banner "CUDA Version": 12.4 on branch 550, 12.6 on 560) and the brand the hook compares, which
# hook_brand derives from nvidia-smi's "Product Brand" as libnvidia-container derives it from NVML's brand (src/driver.c,
# driver_get_device_brand_1_svc): "NVIDIA RTX" (an RTX A5500, NVML_BRAND_NVIDIA_RTX) and "NVIDIA" (an H100) are
# "Unknown" there, "GeForce" stays "GeForce". Each verdict is also taken with the other brands such a card reports
# through NVML (Quadro for older RTX A-series drivers, Tesla for data-center cards), so it does not rest on one.
@pytest.mark.parametrize("product_brand", ["NVIDIA RTX", "Quadro RTX", "Quadro"])
def test_rtx_a5500_on_550_is_allowed_by_its_brand_exception(product_brand):
    facts = {"driver": "550.127.05", "cuda": "12.4", "brand": hook_brand(product_brand), "arch": "8.6"}
    assert satisfied(REQUIRE_12_8_1, facts) and refusal(REQUIRE_12_8_1, facts, "0") is None
    assert not satisfied(REQUIRE_12_8_1, dict(facts, driver="555.42.02", cuda="12.5"))   # 555: no exception


@pytest.mark.parametrize("product_brand", ["NVIDIA", "Tesla"])
def test_h100_on_550_is_allowed(product_brand):
    assert satisfied(REQUIRE_12_8_1, {"driver": "550.90.07", "cuda": "12.4", "brand": hook_brand(product_brand),
                                      "arch": "9.0"})


def test_geforce_on_560_is_refused_naming_the_driver_it_needs():
    facts = {"driver": "560.35.03", "cuda": "12.6", "brand": hook_brand("GeForce"), "arch": "8.9"}
    assert not satisfied(REQUIRE_12_8_1, facts)
    text = refusal(REQUIRE_12_8_1, facts, "0 (NVIDIA GeForce RTX 4090)")
    assert "GPU 0 (NVIDIA GeForce RTX 4090)" in text and "driver 560.35.03" in text and "CUDA 12.6" in text
    assert "a driver of CUDA 12.8 or newer" in text and "branch" not in text
    # a driver of CUDA 12.8 meets cuda>=12.8 whatever the brand
    assert satisfied(REQUIRE_12_8_1, dict(facts, driver="570.124.06", cuda="12.8"))


def test_a_datacenter_card_on_a_branch_without_exception_is_told_its_branches():
    facts = {"driver": "555.42.02", "cuda": "12.5", "brand": "Tesla"}
    assert allowed_branches(REQUIRE_12_8_1, "tesla") == ["470", "535", "550", "560", "565"]
    assert "for brand Tesla, a driver of the branch 470, 535, 550, 560, 565" in refusal(REQUIRE_12_8_1, facts, "1")


def test_an_unread_fact_satisfies_its_condition_as_in_the_hook():
    assert satisfied("cuda>=12.8", {"cuda": None, "driver": "550.127.05"})
    assert satisfied("brand=tesla,driver>=550,driver<551", {"brand": None, "driver": "550.127.05"})
    assert not satisfied("brand=tesla,driver>=550,driver<551", {"brand": "GeForce", "driver": "550.127.05"})


def test_every_condition_of_an_alternative_must_hold():
    req = "cuda>=13.0 brand=tesla,driver>=550,driver<551"
    assert not satisfied(req, {"cuda": "12.4", "driver": "551.10", "brand": "Tesla"})
    assert not satisfied(req, {"cuda": "12.4", "driver": "549.99", "brand": "Tesla"})
    assert satisfied(req, {"cuda": "12.4", "driver": "550.1", "brand": "tesla"})
    assert satisfied("arch>=8.0", {"arch": "8.6"}) and not satisfied("arch>=8.0", {"arch": "7.5"})
    assert satisfied("brand!=geforce", {"brand": "Tesla"}) and not satisfied("brand!=geforce", {"brand": "GeForce"})


# The reads on the host: the image's environment, nvidia-smi -q, the brand as the hook names it
# (libnvidia-container src/driver.c, driver_get_device_brand_1_svc).
DATA = Path(__file__).resolve().parents[3] / "data" / "nvidia_smi"


@pytest.mark.parametrize("product_brand, expected", [
    ("GeForce", "GeForce"), ("Tesla", "Tesla"), ("Quadro", "Quadro"), ("GRID", "GRID"), ("NVS", "NVS"),
    ("Titan", "TITAN"), ("NVIDIA RTX", "Unknown"), ("NVIDIA", "Unknown"), ("Quadro RTX", "Unknown"),
    ("GeForce RTX", "Unknown"), ("NVIDIA RTX Virtual Workstation", "Unknown"), (None, None), ("", None),
])
def test_the_brand_is_named_as_the_hook_names_it(product_brand, expected):
    assert hook_brand(product_brand) == expected


def test_the_image_environment_is_read_from_its_json():
    assert parse_image_env('["PATH=/usr/bin","NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=470,driver<471",'
                           '"EMPTY=","NOEQ"]') == {"PATH": "/usr/bin", "EMPTY": "",
                                                   VARIABLE: "cuda>=12.8 brand=tesla,driver>=470,driver<471"}
    assert parse_image_env("null") == {}
    with pytest.raises(ValueError):
        parse_image_env('{"PATH": "/usr/bin"}')


def _run(answers, calls):
    def run(argv):
        calls.append(argv)
        for start, answer in answers.items():
            if argv[:len(start)] == list(start):
                return answer
        raise AssertionError(argv)
    return run


def _gpu_info(index, name, bus, driver, arch):
    return {"nvidia_smi": "/usr/bin/nvidia-smi", "gpus": [{"index": index, "name": name, "pci_bus_id": bus,
                                                           "driver_version": driver, "compute_capability": arch}]}


@pytest.mark.parametrize("fixture, gpu, refused", [
    ("rtx_a5500", (0, "NVIDIA RTX A5500", "00000000:01:00.0", "550.127.05", "8.6"), False),
    ("rtx_4090", (0, "NVIDIA GeForce RTX 4090", "00000000:01:00.0", "560.35.03", "8.9"), True),
])
def test_read_gives_each_gpu_s_facts_and_the_verdict(fixture, gpu, refused):
    env = json.dumps(["PATH=/usr/bin", VARIABLE + "=" + REQUIRE_12_8_1])
    calls = []
    run = _run({("podman", "image", "inspect"): (0, env, ""),
                ("/usr/bin/nvidia-smi", "-q"): (0, (DATA / (fixture + ".q.txt")).read_text(), "")}, calls)
    found = read(run, "podman", "localhost/ai-llm:cuda", _gpu_info(*gpu))
    assert calls[0] == ["podman", "image", "inspect", "--format", "{{json .Config.Env}}", "localhost/ai-llm:cuda"]
    assert found["found"] and found["require"] == REQUIRE_12_8_1
    facts = found["gpus"][0]
    assert (facts["driver"], facts["arch"]) == (gpu[3], gpu[4])
    assert facts["cuda"] == ("12.4" if not refused else "12.6")
    assert facts["brand"] == ("Unknown" if not refused else "GeForce")
    problems = refusals(found, [0])
    assert bool(problems) is refused
    if refused:
        assert "GPU 0 (NVIDIA GeForce RTX 4090) (driver 560.35.03, CUDA 12.6, brand GeForce)" in problems[0]
        assert "a driver of CUDA 12.8 or newer" in problems[0]
    assert refusals(found, [1]) == [] and refusals(found, []) == []


def test_an_image_without_the_variable_or_absent_asks_nothing_of_the_gpus():
    calls = []
    cpu = read(_run({("docker", "image", "inspect"): (0, '["PATH=/bin"]', "")}, calls), "docker", "ai-llm:cpu",
               _gpu_info(0, "x", "00000000:01:00.0", "560.35.03", "8.9"))
    assert cpu == {"image": "ai-llm:cpu", "found": True, "require": None} and len(calls) == 1
    absent = read(_run({("podman", "image", "inspect"): (125, "", "Error: no such image")}, []), "podman", "x:y",
                  _gpu_info(0, "x", "00000000:01:00.0", "560.35.03", "8.9"))
    assert absent["found"] is False and "no such image" in absent["error"] and refusals(absent, [0]) == []


def test_facts_nvidia_smi_cannot_give_count_as_met():
    run = _run({("podman", "image", "inspect"): (0, json.dumps([VARIABLE + "=" + REQUIRE_12_8_1]), ""),
                ("/usr/bin/nvidia-smi", "-q"): (6, "", "failed")}, [])
    found = read(run, "podman", "i", _gpu_info(0, "NVIDIA GeForce RTX 4090", "00000000:01:00.0", "560.35.03", "8.9"))
    assert found["gpus"][0]["cuda"] is None and found["gpus"][0]["brand"] is None
    assert refusals(found, [0]) == []


def test_an_invalid_requirement_is_refused_naming_the_image():
    problems = refusals({"image": "i:1", "found": True, "require": "cuda>=12.8x", "gpus": []}, [0])
    assert len(problems) == 1 and "i:1" in problems[0] and "invalid expression" in problems[0]
