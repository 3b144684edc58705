"""Load one model on QNN HTP with CPU fallback off; print seconds and own peak RSS."""

import json
import sys
import time

from winml_recipes.runtime.memory import own_peak_rss_mb
from winml_recipes.runtime.sessions import open_session

started = time.perf_counter()
s = open_session(sys.argv[1], "qnn-htp", fallback=False)
print(
    json.dumps(
        {"load_seconds": round(time.perf_counter() - started, 2), "peak_rss_mb": own_peak_rss_mb()}
    )
)
