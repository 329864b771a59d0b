"""The CPU compatibility layer: one test per known fact about torchtitan 0.2.2 on a machine without GPU."""
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from recipe.compat import cpu as cpu_compat

from .helpers import child_env
from .warm_python import run_python

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not cpu_compat.on_cpu_only(), reason="the layer is active only without an accelerator")


def test_importing_the_recipe_imports_nothing_and_patches_torchtitan_when_it_is_imported():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import recipe.errors\n"
        "print('torch' in sys.modules)\n"
        "import recipe.data.loader, torchtitan.tools.utils as utils\n"
        "print(utils.device_type, type(sys.modules['torchtitan'].__loader__).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "cpu", "SourceFileLoader"]


def test_importing_the_recipe_after_torchtitan_patches_it_at_once():
    code = "import torchtitan.tools.utils as utils\nprint(utils.device_type)\nimport recipe\nprint(utils.device_type)\n"
    out = run_python(["-c", code], env=child_env(), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["cuda", "cpu"]


def test_1_torchtitan_imports_without_triton():
    # A fresh interpreter where `import triton` fails, as with CPU wheels of torch.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import recipe.train.train_spec, torchtitan.train\n"
        "from torchtitan.models.moe.kernels import generate_permute_indices\n"
        "try:\n    generate_permute_indices()\nexcept RuntimeError as e:\n    print('RAISED', e)\n"
        "import recipe.compat; print(recipe.compat.install())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RAISED MoE token permutation needs triton" in out.stdout
    assert "['moe_kernels_without_triton', 'device_cpu']" in out.stdout


def test_2_device_type_is_cpu_everywhere_torchtitan_bound_it():
    from torchtitan.tools.utils import get_device_info

    assert get_device_info()[0] == "cuda"  # the stock fallback this layer corrects
    bound = {name: mod.device_type for name, mod in sys.modules.items()
             if name.startswith("torchtitan") and isinstance(getattr(mod, "device_type", None), str)}
    assert set(cpu_compat.DEVICE_BINDING_MODULES) <= set(bound)
    assert set(bound.values()) == {"cpu"}, bound


def test_3_device_memory_monitor_reports_process_peak_memory():
    from torchtitan.components.metrics import DeviceMemoryMonitor

    assert not hasattr(torch.cpu, "get_device_properties")  # why the monitor fails on plain torch.cpu
    monitor = DeviceMemoryMonitor("cpu")
    before = monitor.get_peak_stats().max_reserved_gib
    block = torch.ones(64 * 2**20 // 4 + int(torch.randint(0, 1024, ())))  # >= 64 MiB, touched
    peak_gib = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # noqa: E731
    low = peak_gib()
    after = monitor.get_peak_stats()
    assert block.sum() > 0 and low <= after.max_reserved_gib <= peak_gib() and after.max_reserved_gib >= before > 0
    assert monitor.device_capacity_gib > 0
    assert after.max_reserved_pct == pytest.approx(100 * after.max_reserved_gib / monitor.device_capacity_gib,
                                                   rel=1e-2, abs=1e-2)


@pytest.fixture
def one_rank_gloo_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_4_barrier_with_the_device_index_passes_on_gloo(one_rank_gloo_group):
    from torchtitan.distributed import utils as dist_utils

    with pytest.raises(TypeError):
        dist.barrier(device_ids=[torch.cpu.current_device()])  # 'cpu': what the stock call passes
    dist.barrier(device_ids=[dist_utils.device_module.current_device()])


def test_5_fsdp_modules_reduce_with_plain_sum(one_rank_gloo_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from models.llama3_lighthouse.parallelize import force_sum_reduction

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    groups = [g for m in model.modules() if hasattr(m, "_get_fsdp_state")
              for g in m._get_fsdp_state()._fsdp_param_groups]
    assert groups and not any(g.force_sum_reduction_for_comms for g in groups)
    force_sum_reduction(model)
    assert all(g.force_sum_reduction_for_comms for g in groups)
    # The 2-process FSDP run in test_recipe_train exercises the gloo reduce-scatter itself.


@pytest.mark.slow
def test_6_ring_attention_runs_on_cpu_and_cp2_training_matches_cp1(tmp_path):
    """A CP=2 run on two gloo processes, from the same seed checkpoint, gives the losses and selection
    statistics of a 1-process run; a compiled FSDP 2 x CP 2 run with full activation checkpointing (four
    processes) gives the losses of an eager FSDP 2 run, which shards the data the same way."""
    from .helpers import torchrun, train_in_one_process
    from recipe.logs.layout import METRICS_FILE, read_metrics

    common = ["--job.config_file", "configs/debug.toml", "--lighthouse.topk", "64",
              "--training.steps", "2", "--checkpoint.enable", "--checkpoint.interval", "100"]
    # The dense-shadow validation is compared between cp1 and cp2 only: the FSDP runs compare losses and skip it.
    validation = ["--validation.enable", "--validation.dataset", "synthetic", "--validation.freq", "2",
                  "--validation.steps", "1", "--validation.seq_len", "512"]
    seed = [*common, "--job.dump_folder", str(tmp_path / "seed"), "--checkpoint.create_seed_checkpoint"]
    load = ["--checkpoint.initial_load_path", str(tmp_path / "seed" / "checkpoint" / "step-0")]
    fsdp2 = ["--parallelism.data_parallel_shard_degree", "2", "--training.local_batch_size", "1"]
    # The seed checkpoint, then the 1-process run from it: one after the other in one interpreter (one import).
    one_process = [seed, [*common, *validation, *load, "--job.dump_folder", str(tmp_path / "cp1")]]
    out = train_in_one_process(one_process)
    assert out.returncode == 0, "seed, cp1: " + out.stderr[-4000:]
    launches = {
        "cp2": (2, [*common, *validation, *load, "--job.dump_folder", str(tmp_path / "cp2"),
                    "--parallelism.context_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1"]),
        "fsdp2": (2, [*common, *load, *fsdp2, "--job.dump_folder", str(tmp_path / "fsdp2")]),
        "fsdp2-cp2-compiled": (4, [*common, *load, *fsdp2, "--job.dump_folder", str(tmp_path / "fsdp2-cp2-compiled"),
                                   "--parallelism.context_parallel_degree", "2", "--compile.enable",
                                   "--compile.backend", "aot_eager", "--activation_checkpoint.mode", "full"]),
    }
    for name, (procs, argv) in launches.items():
        out = torchrun(procs, ["train.py", *argv])
        assert out.returncode == 0, f"{name}: " + out.stderr[-4000:]
        if name == "cp2":
            assert "Applied context parallel to 3 Lighthouse layers (degree 2)" in out.stdout + out.stderr
    records = {name: read_metrics(str(tmp_path / name / METRICS_FILE)) for name in ("cp1", *launches)}
    shadow = lambda records: [r[k] for r in records if "validation/dense_loss" in r  # noqa: E731
                              for k in ("validation/lighthouse_loss", "validation/dense_loss")]
    assert shadow(records["cp2"]) == pytest.approx(shadow(records["cp1"]), rel=1e-5)
    assert len(shadow(records["cp1"])) == 4  # steps 1 and 2
    cp1, cp2, fsdp, compiled = ([r for r in records[name] if "loss_metrics/global_avg_loss" in r]
                                for name in ("cp1", "cp2", "fsdp2", "fsdp2-cp2-compiled"))
    loss = lambda records: [r["loss_metrics/global_avg_loss"] for r in records]  # noqa: E731
    assert [r["step"] for r in cp2] == [r["step"] for r in compiled] == [1, 2]
    assert loss(cp2) == pytest.approx(loss(cp1), rel=1e-5)
    # torch.compile with full activation checkpointing under FSDP x CP, as the GPU recipe trains: the same losses.
    assert loss(compiled) == pytest.approx(loss(fsdp), rel=1e-5)
    # Selection statistics under CP are those of the whole sequence, as in the 1-process run.
    for name in ("lighthouse/S", "lighthouse/expanded_share/l1", "lighthouse/evenness/l1", "lighthouse/evenness/l2"):
        assert [r[name] for r in cp2] == pytest.approx([r[name] for r in cp1], rel=1e-3), name
