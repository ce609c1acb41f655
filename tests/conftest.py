"""tests/vllm needs the vllm package, which lives in an environment of its own (.venv-vllm,
built by ``make test``): elsewhere those tests are not collected at all, rather than shown as
skipped."""

import importlib.util

# tests/ is on sys.path, so tests/vllm itself is found as a namespace package (no origin).
_spec = importlib.util.find_spec("vllm")
collect_ignore = [] if _spec is not None and _spec.origin is not None else ["vllm"]
