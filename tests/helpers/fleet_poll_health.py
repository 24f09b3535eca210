"""Poll one URL until killed, printing ``<start epoch> <HTTP status or -1>`` per poll (run inside a fleet host's
network namespace by ``HealthPoller``)."""
from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request


def main(url, interval, timeout):
    while True:
        start = time.time()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (OSError, ValueError):
            status = -1
        print("%.3f %d" % (start, status), flush=True)
        time.sleep(max(0.0, interval - (time.time() - start)))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
