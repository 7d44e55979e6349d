"""Which product path serves (engine/qkernel.py): said by `make install`, run.json and /health; a failed kernel
build fails the install unless the user opts out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specledger.engine import qkernel

pytestmark = pytest.mark.kernel


def _install(tmp_path, **env):
    """`make install`'s kernel step with a compiler that does not exist, in an empty kernel cache."""
    e = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "SPECLEDGER_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run([sys.executable, "-m", "specledger.engine.qkernel"], capture_output=True, text=True,
                          env=e, timeout=300)


def test_a_failed_kernel_build_fails_the_install_loudly(tmp_path):
    if qkernel.platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("no kernel on this architecture: the install says so and goes on")
    r = _install(tmp_path)
    assert r.returncode == 1 and "error: the quantized-product kernel did not build" in r.stderr
    assert "SPECLEDGER_ALLOW_NO_KERNEL=1" in r.stderr and "Traceback" not in r.stderr


def test_the_user_may_opt_out_of_the_kernel(tmp_path):
    r = _install(tmp_path, SPECLEDGER_ALLOW_NO_KERNEL="1")
    assert r.returncode == 0 and "Traceback" not in r.stderr


def test_install_names_the_path_it_will_use():
    if qkernel.op() is None:
        pytest.skip("the engine's kernel is unavailable on this host")
    r = subprocess.run([sys.executable, "-m", "specledger.engine.qkernel"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and f"this host will use: specledger kernel, {qkernel.host_isa()}" in r.stdout


def test_describe_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SPECLEDGER_QKERNEL", "off")
    assert qkernel.describe() == "PyTorch's kernels (SPECLEDGER_QKERNEL=off)"
    monkeypatch.setenv("SPECLEDGER_QKERNEL", "avx2")
    if qkernel.op() is not None:
        assert qkernel.describe().endswith(", forced to avx2")


def test_a_run_records_its_kernel_path():
    from specledger.bench.env import collect_conditions

    c = collect_conditions({}, seed=0, backends={}, energy="unavailable")
    assert c.kernel == qkernel.describe()
    assert collect_conditions({}, seed=0, backends={}, energy="unavailable", local_engine=False).kernel is None


def test_the_run_summary_and_the_report_name_the_path(tmp_path):
    from specledger.records.results import Conditions, RunResult, load_run, now, write_run
    from specledger.bench.tables import conditions_line
    from specledger.report.html import _conditions

    run = RunResult(run_id="r", created=now(), conditions=Conditions(python="3", specledger="0", platform="p",
                                                                      kernel="specledger kernel, avx2"))
    write_run(tmp_path, run)
    assert "products: specledger kernel, avx2" in conditions_line(run)
    assert "products: specledger kernel, avx2" in _conditions(load_run(tmp_path), tmp_path)[2]


def test_the_embedded_model_runs_the_table_of_ops_that_names_its_path(smollm):
    """The kernels are chosen once, at load (cpu_ops.resolve): every module of the embedded model runs the one table,
    and that table names the path run.json, the report and /health say (qkernel.describe())."""
    from specledger.engine import cpu_ops
    from specledger.engine.model import Kernels

    ops = smollm.model.ops
    assert ops.path == qkernel.describe()
    assert all(m.ops is ops for m in smollm.model.modules() if isinstance(m, Kernels))
    loaded = qkernel.op() is not None
    assert (ops.qmm is not None, ops.rms_norm is not cpu_ops.rms_norm, ops.decode_layer is not cpu_ops.declines) == (
        loaded, loaded, loaded)
    assert smollm.model.new_cache(4).k.dtype == ops.kv_dtype(smollm.model.dtype)
