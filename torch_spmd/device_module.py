"""``torch.spmd``: the device module torch 2.x looks up for the ``spmd`` backend.

torch calls into it by name: ``torch.manual_seed`` seeds every backend's generator through
``manual_seed_all``, ``tensor.to("spmd")`` and autocast ask ``is_available``/``device_count``/
``current_device``, ``torch.random.fork_rng`` uses ``get_rng_state``/``set_rng_state``, and
``torch.distributed.checkpoint``'s ``FileSystemWriter`` stages device-to-host copies on
``current_stream()`` inside ``stream(...)`` (a backend that reports ``is_available`` must have
them, or every DCP save in a process that imported torch_spmd fails).

In SPMD mode there is one logical device (index 0); the emulated devices of the mesh sit behind
it (``torch_spmd.runtime.global_runtime_device_count()``). Device randomness draws its seeds from
the default CPU generator when an op is recorded, so the RNG functions here are that generator's.
"""
import contextlib

import torch


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Logical devices: 1 (the emulated devices behind it are the runtime's)."""
    return 1


def current_device() -> int:
    return 0


def _check_index(device) -> int:
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    if index not in (None, 0):
        raise ValueError(f"the spmd device has a single logical index 0, got {index}")
    return 0


def set_device(device) -> None:
    _check_index(device)


@contextlib.contextmanager
def device(device):
    _check_index(device)
    yield


def synchronize(device=None) -> None:
    """Steps run synchronously on the emulated devices: nothing is left in flight."""
    _check_index(device if device is not None else 0)


class Stream:
    """The spmd device's only stream. Every step runs synchronously (a device-to-host copy
    returns finished data), so there is never anything to wait for."""
    device_type = "spmd"
    device_index = 0

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<torch_spmd.device_module.Stream spmd:0>"


_STREAM = Stream()


def current_stream(device=None) -> Stream:
    _check_index(device if device is not None else 0)
    return _STREAM


def default_stream(device=None) -> Stream:
    return current_stream(device)


@contextlib.contextmanager
def stream(s):
    """Makes ``s`` current: a no-op, there is one stream."""
    yield


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device="spmd") -> torch.Tensor:
    _check_index(device)
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device="spmd") -> None:
    _check_index(device)
    torch.default_generator.set_state(new_state)


def get_rng_state_all():
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    for state in new_states:
        set_rng_state(state)
