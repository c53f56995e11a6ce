"""Test-wide setup: 8 fake CPU devices and unoptimised machine code (both set before jax is imported), and parsed
absl flags for Grain.

The suite's programs are small and each runs a few times, so compiling them is most of its time. XLA's backend
optimisation level 0 skips LLVM's passes over the generated code (XLA's own HLO passes, fusion included, still run):
the whole suite took 715 s instead of 905 s on 2 cores, with every test passing. Speed is measured in
`benchmarks/`, which run at the default level. Setting the level in XLA_FLAGS overrides this one; actor and
learner processes the tests start inherit the flags.

Runs that use the shared compilation cache by default (`ranger_jax.compilation_cache.default_dir`, e.g. a sim-tiny
run) compile into a folder of this test process's own, removed at exit, never into the user's ~/.cache.
"""
import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_CACHE = tempfile.mkdtemp(prefix="ranger_jax_test_cache_")
os.environ["RANGER_JAX_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()

import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees every compiled program after each test module. XLA maps each CPU executable's code into memory
    separately, and one process compiling the whole suite's programs (thousands) runs into the kernel's limit on
    memory mappings (vm.max_map_count, 65530 by default), where XLA's compiler crashes."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def every_program_cacheable():
    """A persistent-cache minimum compile time of 0 for the test, so only the cache folder setting decides whether a
    compiled program is written (tests of `ranger_jax.compilation_cache` scoping)."""
    saved = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved)
