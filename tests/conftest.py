"""tests/vllm needs the vllm package, which lives in an environment of its own (.venv-vllm,
built by ``make test``): elsewhere those tests are not collected at all, rather than shown as
skipped."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm"]
