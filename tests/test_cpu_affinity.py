import os
import subprocess
import sys
import textwrap

import pytest

from ranger_jax import cpu_affinity

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")


@pytest.mark.parametrize("parts, cpus, expected", [
    (2, [0, 1], [[0], [1]]),
    (1, [0, 1], [[0, 1]]),
    (3, [0, 1], [[0], [1], [0]]),
    (2, [0, 1, 2, 3, 4, 5, 6, 7], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (3, [0, 1, 2, 3, 4, 5, 6, 7], [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (2, [4, 9, 11], [[4, 9], [11]]),
])
def test_split_shares_the_cpus_out_contiguously_and_evenly(parts, cpus, expected):
    shares = cpu_affinity.split_cpus(parts, cpus)
    assert shares == expected
    if parts <= len(cpus):
        assert sorted(c for share in shares for c in share) == sorted(cpus)  # every cpu once


def test_split_and_parse_refuse_what_they_cannot_use():
    assert cpu_affinity.split_cpus(1) == [cpu_affinity.usable_cpus()]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match=f"positive int of parts; got {bad!r}"):
            cpu_affinity.split_cpus(bad, [0])
    with pytest.raises(ValueError, match="at least one cpu"):
        cpu_affinity.split_cpus(2, [])
    assert cpu_affinity.parse_cpus("0,1") == [0, 1] and cpu_affinity.parse_cpus("3") == [3]
    for bad in ("", "a", "0,", "-1", "1,-2"):
        with pytest.raises(ValueError, match=f"--cpus must be comma-separated CPU ids .*got {bad!r}"):
            cpu_affinity.parse_cpus(bad)


@linux_only
def test_pin_restricts_every_thread_of_the_process_and_names_cpus_it_cannot_use():
    # in a child process: pinning this test process would slow the rest of the suite
    script = textwrap.dedent("""
        import os, threading
        from ranger_jax import cpu_affinity
        first = cpu_affinity.usable_cpus()[0]
        ready, done = threading.Event(), threading.Event()
        seen = {}
        def before():  # a thread started before the pin
            ready.set(); done.wait(); seen["before"] = sorted(os.sched_getaffinity(0))
        t = threading.Thread(target=before); t.start(); ready.wait()
        assert cpu_affinity.pin([first]) == [first]
        done.set(); t.join()
        after = threading.Thread(target=lambda: seen.__setitem__("after", sorted(os.sched_getaffinity(0))))
        after.start(); after.join()
        assert seen == {"before": [first], "after": [first]}, seen
        assert cpu_affinity.usable_cpus() == [first]
        try:
            cpu_affinity.pin([first + 1000])
        except ValueError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "cannot pin to CPU(s) [" in out.stdout and "this process may run on [" in out.stdout
    with pytest.raises(ValueError, match="at least one cpu"):
        cpu_affinity.pin([])
