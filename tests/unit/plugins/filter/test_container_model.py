"""The container_model filter on containers as podman 4.3 and docker inspect them.

The precedence rules come from llama.cpp's common/arg.cpp (common_params_parse_ex): environment variables are
applied first and every command-line argument overrides them; an option given twice keeps the last value;
``-m``/``--model`` is the model option and ``LLAMA_ARG_MODEL`` its variable. ``--model=PATH`` is not an argument
llama.cpp knows ("error: invalid argument"), so it names no model.
"""
from __future__ import annotations

import copy

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ai_llm.moe_offload.plugins.filter.container_model import FilterModule, container_model

# A container of this collection's image, as `podman inspect` (podman 4.3.1) printed it for
# `podman run -v /srv/models:/models:ro -e MODEL_PATH=/models/nano.gguf localhost/ai-llm:cpu-b10435 -c 512`
# (the keys the filter reads, and some it must ignore).
OURS = {
    "Name": "ai-llm", "Path": "/usr/local/bin/start-llama-server", "Args": ["-c", "512"],
    "Config": {
        "Env": ["TERM=xterm", "container=podman", "LLAMA_SERVER_BIN=/opt/llama/bin/llama-server",
                "MODEL_PATH=/models/nano.gguf", "PATH=/usr/local/bin:/bin", "HOME=/root", "HOSTNAME=vm"],
        "Entrypoint": "/usr/local/bin/start-llama-server", "Cmd": ["-c", "512"], "WorkingDir": "/"},
    "Mounts": [{"Type": "bind", "Source": "/srv/models", "Destination": "/models", "Driver": "", "Mode": "",
                "Options": ["rbind"], "RW": False, "Propagation": "rprivate"}],
}

# llama.cpp's server image (ENTRYPOINT ["/app/llama-server"]) as `docker inspect` prints it: Name with a
# leading slash, Config.Entrypoint a list.
UPSTREAM = {
    "Name": "/llama", "Path": "/app/llama-server", "Args": ["--host", "0.0.0.0", "--port", "8080"],
    "Config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "LLAMA_ARG_HOST=0.0.0.0"],
               "Entrypoint": ["/app/llama-server"], "WorkingDir": "/app"},
    "Mounts": [{"Type": "bind", "Source": "/data/llm", "Destination": "/models", "Mode": "ro", "RW": False,
                "Propagation": "rprivate"}],
}


def upstream(args=(), env=(), mounts=None, **keys):
    container = copy.deepcopy(UPSTREAM)
    container["Args"] += list(args)
    container["Config"]["Env"] += list(env)
    if mounts is not None:
        container["Mounts"] = mounts
    container.update(keys)
    return container


def test_the_container_the_role_deploys_passes_model_path():
    assert container_model(OURS) == {
        "container": "ai-llm", "container_path": "/models/nano.gguf", "source": "MODEL_PATH",
        "host_path": "/srv/models/nano.gguf", "error": ""}
    # start-llama-server appends the compose `command:` after its own --model "$MODEL_PATH": the last -m wins
    assert container_model(dict(OURS, Args=["-m", "/models/other.gguf"]))["host_path"] == "/srv/models/other.gguf"


MOUNTS = [{"Type": "bind", "Source": "/data", "Destination": "/"},
          {"Type": "bind", "Source": "/srv/llm/", "Destination": "/models/"},
          {"Type": "volume", "Name": "big", "Source": "/var/lib/containers/storage/volumes/big/_data",
           "Destination": "/models/big"}]


@pytest.mark.parametrize("container, source, host", [
    (upstream(["-m", "/models/a.gguf"]), "-m", "/data/llm/a.gguf"),
    (upstream(["--model", "/models/sub/b.gguf"]), "--model", "/data/llm/sub/b.gguf"),
    (upstream(env=["LLAMA_ARG_MODEL=/models/c.gguf"]), "LLAMA_ARG_MODEL", "/data/llm/c.gguf"),
    (upstream(env=["MODEL=/models/d.gguf"]), "MODEL", "/data/llm/d.gguf"),
    # the command line overrides LLAMA_ARG_MODEL ("will be overwritten by command line argument")
    (upstream(["-m", "/models/a.gguf"], ["LLAMA_ARG_MODEL=/models/c.gguf"]), "-m", "/data/llm/a.gguf"),
    # LLAMA_ARG_MODEL is llama.cpp's own; MODEL only a wrapper convention
    (upstream(env=["MODEL=/models/d.gguf", "LLAMA_ARG_MODEL=/models/c.gguf"]), "LLAMA_ARG_MODEL", "/data/llm/c.gguf"),
    # given twice: the last one wins
    (upstream(["-m", "/models/first.gguf", "--model", "/models/last.gguf"]), "--model", "/data/llm/last.gguf"),
    # a value taken from the environment by the shell that starts llama-server
    (upstream(["-m", "$MODEL"], ["MODEL=/models/e.gguf"]), "-m", "/data/llm/e.gguf"),
    (upstream(["--model", "${MODEL}"], ["MODEL=/models/e.gguf"]), "--model", "/data/llm/e.gguf"),
    # relative to the working directory (/app), normalised
    (upstream(["-m", "../models/./f.gguf"]), "-m", "/data/llm/f.gguf"),
    # a trailing flag without a value is ignored
    (upstream(["-m"], ["LLAMA_ARG_MODEL=/models/c.gguf"]), "LLAMA_ARG_MODEL", "/data/llm/c.gguf"),
    # inside a shell string; one that does not split as a shell would is split on blanks
    (upstream(Path="/bin/sh", Args=["-c", "exec /app/llama-server --port 8080 -m '/models/my model.gguf'"]), "-m",
     "/data/llm/my model.gguf"),
    (upstream(Path="/bin/sh", Args=["-c", "llama-server -m /models/g.gguf --alias 'x"]), "-m", "/data/llm/g.gguf"),
    # the longest matching mount wins; /models-old is not under /models
    (upstream(["-m", "/models/big/h.gguf"], mounts=MOUNTS), "-m", "/var/lib/containers/storage/volumes/big/_data/h.gguf"),
    (upstream(["-m", "/models/h.gguf"], mounts=MOUNTS), "-m", "/srv/llm/h.gguf"),
    (upstream(["-m", "/elsewhere/h.gguf"], mounts=MOUNTS), "-m", "/data/elsewhere/h.gguf"),
    (upstream(["-m", "/models-old/h.gguf"], mounts=MOUNTS), "-m", "/data/models-old/h.gguf"),
])
def test_the_forms_of_the_upstream_image(container, source, host):
    result = container_model(container)
    assert (result["source"], result["host_path"], result["error"]) == (source, host, "")
    assert result["container"] == "llama"


NO_MODEL = "no -m/--model argument and no LLAMA_ARG_MODEL or MODEL variable"


@pytest.mark.parametrize("container, source, error", [
    # another image's MODEL_PATH means nothing to llama-server
    (upstream(env=["MODEL_PATH=/models/a.gguf"]), "", NO_MODEL),
    (upstream(["--model=/models/a.gguf"]), "", NO_MODEL),
    ({}, "", NO_MODEL),
    (dict(OURS, Config=dict(OURS["Config"], Env=["LLAMA_SERVER_BIN=/opt/llama/bin/llama-server"])), "",
     "no -m/--model argument and no MODEL_PATH, LLAMA_ARG_MODEL or MODEL variable"),
    (upstream(["-hf", "ggml-org/gemma-3-1b-it-GGUF"]), "", NO_MODEL + " (llama-server downloads its model: -hf)"),
    (upstream(env=["LLAMA_ARG_MODEL_URL=https://example.org/m.gguf"]), "",
     NO_MODEL + " (llama-server downloads its model: LLAMA_ARG_MODEL_URL)"),
    (upstream(["-m", "/opt/model.gguf"]), "-m",
     "the model /opt/model.gguf is not on a mount of the host (it is inside the image)"),
    (upstream(["-m", "/models/a.gguf"], mounts=[{"Type": "tmpfs", "Source": "", "Destination": "/models"}]), "-m",
     "the model /models/a.gguf is not on a mount of the host (it is inside the image)"),
])
def test_a_model_without_a_host_path_says_why(container, source, error):
    result = container_model(container)
    assert (result["source"], result["host_path"], result["error"]) == (source, "", error)


@pytest.mark.parametrize("value, message", [
    ([OURS], "container_model: expects one container of podman/docker inspect (a dict), got list"),
    ("ai-llm", "container_model: expects one container of podman/docker inspect (a dict), got str"),
    ({"Path": "/app/llama-server", "Args": ["-m", 3]}, "container_model: Args holds 3, not a string"),
])
def test_bad_input_is_named(value, message):
    with pytest.raises(AnsibleFilterError) as error:
        container_model(value)
    assert error.value.message == message


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"container_model": container_model}
