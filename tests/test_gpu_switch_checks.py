"""What the C++ refuses on its own, on GPUs (#8): the lowering checks every switch, but the
launcher reads its variables again at every launch and communicator setup takes arguments
from any caller, so a value set after lowering, or given by a program this package did not
lower, must be refused there too, naming it, not silently become another setting. One GPU
is enough."""
import numpy as np
import pytest

import jax

import _gpu_util as U

pytestmark = U.MARKS


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _inputs(seed, m=512, k=256, n=512):
    kx, kw = jax.random.split(jax.random.key(seed))
    return U.normal(kx, (m, k)), U.normal(kw, (k, n), 1.0 / np.sqrt(k))


@pytest.mark.parametrize("variable,value", [
    ("FLASHOVERLAP_GEMM_SERPENTINE", "true"),  # atoi read it as 0: the serpentine order off
    ("FLASHOVERLAP_GEMM_PANEL", "abc"), ("FLASHOVERLAP_GEMM_PANEL", "0"),
    ("FLASHOVERLAP_GEMM_TILE", "64"), ("FLASHOVERLAP_GEMM_LOG", "2")])
def test_a_kernel_variable_set_after_lowering_fails_the_launch_naming_it(monkeypatch, variable,
                                                                          value):
    import jax_flashoverlap as fo
    f = jax.jit(fo.matmul)
    x, w = _inputs(1)
    U.assert_custom_call(f, (x, w), "flashoverlap_gemm")
    assert U.rel_fro(f(x, w), U.dot32(x, w)) < U.TOL  # compiled with the defaults
    monkeypatch.setenv(variable, value)  # the compiled program runs again: no lowering
    with pytest.raises(jax.errors.JaxRuntimeError, match=variable) as err:
        f(x, w).block_until_ready()
    assert repr(value) in str(err.value), str(err.value)
    monkeypatch.delenv(variable)
    x2, w2 = _inputs(2)
    got = f(x2, w2)  # nothing left broken
    assert not np.isnan(np.asarray(got, np.float32)).any()
    assert U.rel_fro(got, U.dot32(x2, w2)) < U.TOL


_COMM_ID = 0x5EED0031  # far from comm_id_for's hashes in practice; checked unused below


def _create(**overrides):
    from jax_flashoverlap import _ext
    args = dict(comm_id=_COMM_ID, unique_id=_ext.ext.nccl_unique_id(), world_size=1,
                local_rank_device=[(0, 0)], comm_sms=16, workspace_bytes=1 << 20)
    args.update(overrides)
    _ext.ext.create_communicators(**args)


@pytest.mark.parametrize("overrides,message", [
    # one member per device: a second replaced (and freed) the first in the registry while
    # NCCL still used it, unless NCCL refused the pair itself
    (dict(world_size=2, local_rank_device=[(0, 0), (1, 0)]), "repeat a device or rank"),
    (dict(comm_sms=-1), "comm_sms must be >= 0, got -1"),
])
def test_communicator_setup_refuses_bad_arguments_and_makes_nothing(overrides, message):
    from jax_flashoverlap import _ext
    assert not _ext.ext.has_communicators(_COMM_ID)
    with pytest.raises(RuntimeError, match=message):
        _create(**overrides)
    assert not _ext.ext.has_communicators(_COMM_ID)


def test_communicator_setup_refuses_a_misspelt_wait_then_works(monkeypatch):
    """JAX_FLASHOVERLAP_WAIT is read when communicators are made: anything but unset, empty or
    'spin' silently meant the stream memory operations."""
    from jax_flashoverlap import _ext
    assert not _ext.ext.has_communicators(_COMM_ID)
    monkeypatch.setenv("JAX_FLASHOVERLAP_WAIT", "spinn")
    with pytest.raises(RuntimeError, match="JAX_FLASHOVERLAP_WAIT='spinn' must be 'spin'"):
        _create()
    assert not _ext.ext.has_communicators(_COMM_ID)
    monkeypatch.setenv("JAX_FLASHOVERLAP_WAIT", "")
    _create()
    try:
        assert _ext.ext.has_communicators(_COMM_ID)
    finally:
        _ext.ext.destroy_communicators(_COMM_ID)
    assert not _ext.ext.has_communicators(_COMM_ID)


@pytest.mark.parametrize("wait,expected", [
    (None, ("stream_op", "stream_op")), ("spin", ("spin", "kernel"))])
def test_wait_and_write_methods_are_chosen_when_the_communicator_is_made(monkeypatch, wait,
                                                                         expected):
    """Both follow JAX_FLASHOVERLAP_WAIT when the communicator is made (the flag writes used
    to read it at every call: a value set later changed them mid-run, a typo unchecked). This
    checks what creation stored and reports; that the calls use the stored methods is the
    code's structure (EnqueueWriteFlag takes the method), and peer_reduce_test write_methods
    checks ChosenWriteMethod and both methods' writes."""
    from jax_flashoverlap import _ext

    def methods():
        mine = [c for c in _ext.ext.list_communicators() if c["comm_id"] == _COMM_ID]
        assert len(mine) == 1, mine
        return mine[0]["wait_method"], mine[0]["write_method"]

    if wait is None:
        monkeypatch.delenv("JAX_FLASHOVERLAP_WAIT", raising=False)
    else:
        monkeypatch.setenv("JAX_FLASHOVERLAP_WAIT", wait)
    _create()
    try:
        assert methods() == expected
        monkeypatch.setenv("JAX_FLASHOVERLAP_WAIT", "spin" if wait is None else "")
        assert methods() == expected
    finally:
        _ext.ext.destroy_communicators(_COMM_ID)
