"""A job run from the tests' warm interpreter (tests/warm_python.py) behaves as `python ARGS` in a fresh process:
what it prints, how it ends, what it sees of its arguments, folder and environment."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .helpers import REPO, child_env
from .warm_python import PRELOADED, run_python

ENDINGS = {
    "exit code": "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
    "uncaught exception": "def fail():\n    raise ValueError('bad value')\nfail()",
    "SystemExit with a message": "raise SystemExit('error: one line')",
    "a signal": "import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGTERM)",
    "Ctrl-C": "raise KeyboardInterrupt",
    "atexit and a thread": textwrap.dedent("""\
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran'))
        threading.Thread(target=lambda: (time.sleep(0.5), print('thread joined'))).start()
        print('main ends')"""),
    "what it sees": textwrap.dedent("""\
        import os, sys
        print(sys.argv, repr(sys.path[0]), os.getcwd(), os.environ.get('JOB_SETTING'), sys.stdin.isatty())
        print(sorted(m for m in ('recipe', 'lighthouse', 'models', 'train') if m in sys.modules))"""),
}


def last_frame(stderr: str) -> list[str]:
    """stderr without the traceback frames above the script's own (the warm child's start differs there)."""
    lines = stderr.splitlines()
    return lines[lines.index(next(l for l in lines if 'File "<string>"' in l)):] if "Traceback" in stderr else lines


@pytest.mark.parametrize("program", list(ENDINGS.values()), ids=list(ENDINGS))
def test_a_warm_job_ends_prints_and_sees_what_a_fresh_interpreter_does(program, tmp_path):
    env = {**child_env(), "JOB_SETTING": "42"}
    args = ["-c", program, "first", "second"]
    warm = run_python(args, env=env, timeout=60, cwd=tmp_path)
    fresh = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (warm.returncode, warm.stdout, last_frame(warm.stderr)) == (
        fresh.returncode, fresh.stdout, last_frame(fresh.stderr))


def test_a_script_sees_its_own_folder_first_on_the_path_and_its_name_as_argv_0(tmp_path):
    script = tmp_path / "tool" / "show.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint(sys.argv, sys.path[0], __name__)\n")
    warm = run_python([str(script), "--flag"], env=child_env(), timeout=60)
    assert warm.stdout == f"{[str(script), '--flag']} {script.parent} __main__\n"


def test_a_job_that_sets_a_variable_read_at_import_sees_its_effect_as_a_fresh_interpreter_does():
    """torch reads TORCH_LOGS when it is imported: such a job is forked from a server started with it."""
    program = "import logging; print(logging.getLogger('torch._dynamo').getEffectiveLevel())"
    env = {**child_env(), "TORCH_LOGS": "+dynamo"}
    fresh = subprocess.run([sys.executable, "-c", "import torch\n" + program], env=env, capture_output=True,
                           text=True, timeout=120)
    assert run_python(["-c", program], env=env, timeout=120).stdout == fresh.stdout == "10\n"

def test_omp_num_threads_sets_the_jobs_torch_threads_as_at_a_fresh_start():
    program = "import torch; print(torch.get_num_threads())"
    assert run_python(["-c", program], env={**child_env(), "OMP_NUM_THREADS": "1"}, timeout=60).stdout == "1\n"
    fresh = subprocess.run([sys.executable, "-c", program], env=child_env(), capture_output=True, text=True)
    assert run_python(["-c", program], env=child_env(), timeout=60).stdout == fresh.stdout


def test_a_job_past_its_timeout_is_killed_and_raises_as_subprocess_does():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; print('started', flush=True); time.sleep(60)"], env=child_env(), timeout=2)
    assert run_python(["-c", "print('next')"], env=child_env(), timeout=60, cwd=REPO).stdout == "next\n"


def test_a_job_starts_with_the_large_packages_imported_and_none_of_the_projects():
    program = "import sys; print([name for name in %r if name not in sys.modules], " \
              "[name for name in ('recipe', 'lighthouse', 'models', 'kernels', 'train') if name in sys.modules])"
    assert run_python(["-c", program % (PRELOADED,)], env=child_env(), timeout=120).stdout == "[] []\n"
