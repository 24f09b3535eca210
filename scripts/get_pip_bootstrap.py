"""Stand-in for ansible-test's pip bootstrap script (get-pip.py), which it downloads from a host this
machine cannot reach. Same contract: run with pip-install arguments, it installs pip and then them.
It starts from the pip that CPython bundles (ensurepip); packages still come from PyPI.
scripts/sanity.sh copies it to ~/.ansible/test/cache/get_pip_<version>.py.
"""
import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
os.environ.pop("PIP_CONFIG_FILE", None)  # ensurepip points it at /dev/null; the machine's pip.conf matters
# get-pip.py's own options, which pip install does not know
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))
