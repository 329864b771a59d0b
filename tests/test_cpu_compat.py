"""The CPU compatibility layer: one test per known fact about torchtitan 0.2.2 on a machine without GPU."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import recipe  # noqa: F401  (applies the layer)
from recipe import cpu_compat

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not cpu_compat.on_cpu_only(), reason="the layer is active only without an accelerator")


def test_1_torchtitan_imports_without_triton():
    # A fresh interpreter where `import triton` fails, as with CPU wheels of torch.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import recipe, models, torchtitan.train\n"
        "from torchtitan.models.moe.kernels import generate_permute_indices\n"
        "try:\n    generate_permute_indices()\nexcept RuntimeError as e:\n    print('RAISED', e)\n"
        "print(recipe.cpu_compat.install())\n"
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
    after = monitor.get_peak_stats()
    assert block.sum() > 0 and after.max_reserved_gib >= before > 0
    assert 0 < after.max_reserved_pct < 100
    assert monitor.device_capacity_gib > 0


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
    groups = [g for m in model.modules() if hasattr(m, "_get_fsdp_state") for g in m._get_fsdp_state()._fsdp_param_groups]
    assert groups and not any(g.force_sum_reduction_for_comms for g in groups)
    force_sum_reduction(model)
    assert all(g.force_sum_reduction_for_comms for g in groups)
    # The 2-process FSDP run in test_recipe_train exercises the gloo reduce-scatter itself.


def test_6_context_parallel_is_rejected_on_cpu_before_any_work():
    from torchtitan.config import ConfigManager

    from recipe.trainer import check_job

    config = ConfigManager().parse_args(
        ["--job.config_file", str(REPO / "configs/debug.toml"), "--parallelism.context_parallel_degree", "2",
         "--lighthouse.no-enable"]
    )
    with pytest.raises(ValueError, match="context_parallel_degree=2 needs a GPU"):
        check_job(config)
