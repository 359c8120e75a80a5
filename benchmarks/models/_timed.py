"""Runs a script (or ``torch-renaissance run ...``) in this process; writes its wall time and peak RSS.

    python _timed.py OUT.json SCRIPT ARGS...        plain python (PyTorch's allocator)
    python _timed.py OUT.json --run RUN-ARGS...     torch-renaissance run RUN-ARGS...
"""
import json
import resource
import runpy
import sys
import time

out = sys.argv[1]
t0 = time.perf_counter()
code = 0
if sys.argv[2] == "--run":
    from torch_renaissance.cli import main

    code = main(["run", *sys.argv[3:]])
else:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
seconds = time.perf_counter() - t0
with open(out, "w") as f:
    json.dump({"seconds": seconds, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)
sys.exit(code)
