"""common/huge_pages.py: the decision to run a command again under glibc.malloc.hugetlb=1 (a rule over every
environment: it is made at most once, keeps what GLIBC_TUNABLES held, and is made only where it changes
something), the kernel's THP mode read from its file, and the restart itself in real processes: same process id,
the tunable set, malloc's memory in 2 MB pages afterwards; no restart when switched off, when the user named the
tunable, or for a script run in-process by another. And sample.py restarts itself so (its bad switch is its line)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UserError
from common.huge_pages import TUNABLE, glibc_version, huge_page_environment, thp_mode
from tests.helpers import REPO

MODES = st.sampled_from([None, "always", "madvise", "never", "defer"])
VERSIONS = st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(0, 60)))
ENTRY = st.builds(lambda name, value: f"{name}={value}",
                  st.sampled_from(["glibc.malloc.arena_max", "glibc.malloc.tcache_count", TUNABLE,
                                   "glibc.malloc.hugetlbx", "glibc.pthread.rseq"]),
                  st.integers(0, 9))
TUNABLES = st.one_of(st.none(), st.lists(ENTRY, max_size=4).map(":".join))
SWITCHES = st.one_of(st.none(), st.sampled_from(["0", "1"]))


def environment(tunables: str | None, switch: str | None) -> dict[str, str]:
    env = {"PATH": "/usr/bin", "HOME": "/home/someone"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    if switch is not None:
        env["ATTNGPT_HUGE_PAGES"] = switch
    return env


@settings(max_examples=300, deadline=None)
@given(tunables=TUNABLES, switch=SWITCHES, mode=MODES, glibc=VERSIONS)
def test_the_restart_is_decided_by_rule_and_never_twice(tunables, switch, mode, glibc):
    env = environment(tunables, switch)
    named = tunables is not None and any(e.split("=")[0] == TUNABLE for e in tunables.split(":"))
    wanted = switch != "0" and not named and mode == "madvise" and glibc is not None and glibc >= (2, 35)
    again = huge_page_environment(env, mode, glibc)
    assert (again is not None) == wanted
    if again is None:
        return
    # everything else kept; the tunable appended after what GLIBC_TUNABLES held, which keeps its order
    assert {k: v for k, v in again.items() if k != "GLIBC_TUNABLES"} == {k: v for k, v in env.items()
                                                                           if k != "GLIBC_TUNABLES"}
    entries = again["GLIBC_TUNABLES"].split(":")
    assert entries[-1] == f"{TUNABLE}=1" and ":".join(entries[:-1]) == (tunables or "")
    assert huge_page_environment(again, mode, glibc) is None  # the restarted process does not restart


@given(switch=st.text(max_size=4).filter(lambda s: s not in ("0", "1")))
def test_a_switch_other_than_0_or_1_is_a_user_error_that_names_it(switch):
    with pytest.raises(UserError, match="ATTNGPT_HUGE_PAGES must be 0"):
        huge_page_environment({"ATTNGPT_HUGE_PAGES": switch}, "madvise", (2, 36))


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]\n", "never"), ("always madvise never", None),
                                        ("[always] [never]", None), ("", None)])
def test_thp_mode_is_the_one_bracketed_word(tmp_path, text, mode):
    enabled = tmp_path / "enabled"
    enabled.write_text(text)
    assert thp_mode(enabled) == mode
    assert thp_mode(tmp_path / "absent") is None


# A script that restarts itself and reports, at each start, its process id and GLIBC_TUNABLES, then how much of a
# 64 MiB buffer the kernel gave in huge pages (AnonHugePages of the whole process, kB)
PROBE = """
import os, sys
sys.path.insert(0, {repo!r})
from common.huge_pages import restart_in_huge_pages
print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES", "-"), flush=True)
restart_in_huge_pages("probe")
buffer = bytearray(64 * 2**20)
buffer[::4096] = bytes(len(buffer[::4096]))  # touch every page
huge = [line.split()[1] for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages:")]
print("huge", huge[0] if huge else "-")
"""

can_restart = huge_page_environment({}, thp_mode(), glibc_version()) is not None


def probe(tmp_path: Path, *extra: str, **env: str) -> tuple[list[list[str]], subprocess.CompletedProcess]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(repo=str(REPO)))
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "ATTNGPT_HUGE_PAGES")}
    done = subprocess.run([sys.executable, *extra, str(script)], env={**base, **env}, capture_output=True, text=True)
    return [line.split() for line in done.stdout.splitlines()], done


@pytest.mark.skipif(not can_restart, reason="needs Linux, glibc >= 2.35 and transparent huge pages `madvise`")
def test_a_command_restarts_once_in_its_own_process_with_its_memory_in_huge_pages(tmp_path):
    lines, done = probe(tmp_path, "-X", "utf8")  # an interpreter option travels with the command
    assert done.returncode == 0, done.stderr
    (_, pid1, before), (_, pid2, after), (_, huge_kb) = lines
    assert pid1 == pid2 and before == "-" and after == f"{TUNABLE}=1"
    # some of the 64 MiB buffer in 2 MB pages (all of it on an idle machine; a kernel short of free 2 MB blocks
    # may give fewer), where without the tunable it gets none (below)
    assert int(huge_kb) >= 2048

    lines, done = probe(tmp_path, ATTNGPT_HUGE_PAGES="0")  # switched off: one start, no huge page
    assert [line[0] for line in lines] == ["start", "huge"] and lines[1][1] == "0"

    lines, done = probe(tmp_path, GLIBC_TUNABLES=f"glibc.malloc.arena_max=2:{TUNABLE}=0")  # the user's own choice
    assert [line[0] for line in lines] == ["start", "huge"] and lines[0][2] == f"glibc.malloc.arena_max=2:{TUNABLE}=0"


def test_a_script_run_in_process_by_another_is_not_restarted(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(repo=str(REPO)))
    code = f"import runpy, sys; sys.argv = [{str(script)!r}]; runpy.run_path({str(script)!r}, run_name='__main__')"
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "ATTNGPT_HUGE_PAGES")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["start", "huge"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the restart is Linux's")
def test_a_bad_switch_is_one_line_and_exit_2(tmp_path):
    lines, done = probe(tmp_path, ATTNGPT_HUGE_PAGES="yes")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "probe: error: ATTNGPT_HUGE_PAGES must be 0 (no 2 MB pages) or 1 (the default), got 'yes'"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the restart is Linux's")
def test_sample_py_restarts_itself_before_anything_else():
    """Its bad switch is sample.py's own line, before any model, checkpoint or argument is looked at."""
    env = {**os.environ, "ATTNGPT_HUGE_PAGES": "2"}
    done = subprocess.run([sys.executable, "sample.py", "--ckpt", "/nonexistent", "--prompt", "x"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("sample.py: error: ATTNGPT_HUGE_PAGES must be 0 (no 2 MB pages) or 1 (the "
                                   "default), got '2'")
