"""A job run from the tests' warm interpreter (tests/warm_python.py) behaves as `python ARGS` in a fresh process:
what it prints, how it ends, what it sees of its arguments, folder and environment."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .helpers import REPO, child_env
from .warm_python import PRELOADED, run_python, warm_job, warm_torchrun

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
    unset = {name: value for name, value in child_env().items() if name != "OMP_NUM_THREADS"}
    for env in (unset, {**unset, "OMP_NUM_THREADS": "3"}, {**unset, "OMP_NUM_THREADS": "1"}):
        fresh = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
        assert run_python(["-c", program], env=env, timeout=60).stdout == fresh.stdout


def test_a_job_past_its_timeout_is_killed_and_raises_as_subprocess_does():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; print('started', flush=True); time.sleep(60)"], env=child_env(), timeout=2)
    assert run_python(["-c", "print('next')"], env=child_env(), timeout=60, cwd=REPO).stdout == "next\n"


def test_a_job_starts_with_the_large_packages_imported_and_none_of_the_projects():
    ours = ('recipe', 'lighthouse', 'models', 'lighthouse_kernels', 'train')
    program = "import sys; print([name for name in %r if name not in sys.modules], " \
              f"[name for name in {ours!r} if name in sys.modules])"
    assert run_python(["-c", program % (PRELOADED,)], env=child_env(), timeout=120).stdout == "[] []\n"


def test_a_file_the_job_left_open_is_flushed_when_it_ends(tmp_path):
    """As at a fresh interpreter's exit, which closes the files it still holds."""
    program = f"f = open({str(tmp_path / 'left_open')!r}, 'w'); f.write('written')"
    assert run_python(["-c", program], env=child_env(), timeout=60).returncode == 0
    assert (tmp_path / "left_open").read_text() == "written"


def test_a_signal_to_the_started_command_reaches_the_job_and_the_command_ends_as_the_job_did(tmp_path):
    handled = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(5))\n" \
              "print('ready', flush=True)\ntime.sleep(60)"
    unhandled = "import time; print('ready', flush=True); time.sleep(60)"
    for program, code in ((handled, 5), (unhandled, -signal.SIGTERM)):
        command, env = warm_job(["-c", program], child_env())
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        assert job.stdout.readline() == "ready\n"
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) == code


def test_the_job_of_a_killed_command_is_killed_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    program = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    command, env = warm_job(["-c", program], child_env())
    job = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    job.kill()
    job.wait()
    while Path(f"/proc/{pid_file.read_text()}").exists() and "Z" not in _state(pid_file.read_text()):
        assert time.monotonic() < deadline, "the job outlived its command"
        time.sleep(0.05)


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_torchrun_starts_each_rank_from_the_warm_server_with_its_rank_and_python_u(tmp_path):
    """The command as torchrun's script: every rank is a warm job (torch already imported) with the variables
    torchrun sets for it, and unbuffered streams as `python -u` gives."""
    script = tmp_path / "rank.py"
    # One write per rank: both ranks share the pipe, and print() writes its arguments one by one, which unbuffered
    # streams interleave across processes; a single write under PIPE_BUF bytes lands whole.
    script.write_text("import os, sys\nsys.stdout.write(f\"{os.environ['RANK']} {os.environ['WORLD_SIZE']} "
                      "{'torch' in sys.modules} {sys.stdout.write_through}\\n\")\n")
    command, env = warm_torchrun(["--standalone", "--nproc_per_node=2"], [str(script)],
                                 child_env())
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["0 2 True True", "1 2 True True"]
