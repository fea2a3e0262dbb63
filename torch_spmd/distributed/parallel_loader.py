"""PyTorch/XLA's ``torch_xla.distributed.parallel_loader`` (``pl``): ``MpDeviceLoader``,
``ParallelLoader`` and ``PerDeviceLoader`` for the spmd device.

Each batch of the wrapped CPU loader is moved to the device as it is taken, sharded on the way by
``input_sharding`` (a ``ShardingSpec``, or a dict key -> ``ShardingSpec`` for dict batches; see
``xm.send_cpu_data_to_device``): each device receives only its shard. As in PyTorch/XLA, taking
a batch first ends the step (``torch_xla.sync()``, every ``batches_per_execution`` batches), and
so does exhausting the loader, so a training loop over the loader needs no ``mark_step`` of its
own.

Differences: batches are transferred synchronously when taken (there are no background
threads; the prefetch sizes and ``host_to_device_transfer_threads`` are accepted and ignored):
the emulated devices share the host's memory, so there is no transfer to overlap.
"""
import torch

from .._impl.device import device as _spmd_device
from ..core import xla_model as xm


class PerDeviceLoader(object):
    """The iterator over one device's batches (the spmd device: there is one)."""

    def __init__(self, loader, device):
        self._loader = loader
        self._device = device
        self._sync_batch_count = loader.batches_per_execution - 1
        self._batches_yielded = 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def __len__(self):
        return self._loader.per_device_samples()

    def next(self):
        if self._sync_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            xm.mark_step()
        else:
            self._batches_yielded += 1
        item = self._loader.next_item(self._device)
        if item is None:
            xm.mark_step()
            raise StopIteration
        return item


class ParallelLoader(object):
    """Wraps a CPU data loader; ``per_device_loader(device)`` iterates its batches on the device.

    Args:
      cpu_loader: the loader (any iterable of batches: tensors, or dicts/lists/tuples of them).
      devices: the devices to send batches to; torch_spmd has one, the spmd device (``'xla'``
        device strings of PyTorch/XLA scripts are taken to mean it).
      batchdim, loader_prefetch_size, device_prefetch_size, host_to_device_transfer_threads:
        accepted for compatibility.
      batches_per_execution: how many batches one step spans (a sync every that many batches).
      input_sharding: ``ShardingSpec`` or dict of them applied to the batches' tensors.
    """

    def __init__(self, cpu_loader, devices, batchdim=0, batches_per_execution=1,
                 loader_prefetch_size=16, device_prefetch_size=8,
                 host_to_device_transfer_threads=1, input_sharding=None):
        self._cpu_loader = cpu_loader
        self._devices = [_as_spmd_device(d) for d in devices]
        self._batchdim = batchdim
        self._batches_per_execution = batches_per_execution
        self._input_sharding = input_sharding
        self._iterator = None
        self._done = False

    def per_device_loader(self, device):
        """The batches for ``device`` (the spmd device)."""
        device = _as_spmd_device(device)
        if device not in self._devices:
            raise ValueError(f"{device} is not one of this loader's devices {self._devices}")
        return PerDeviceLoader(self, device)

    def per_device_samples(self):
        return len(self._cpu_loader) // len(self._devices)

    @property
    def batches_per_execution(self):
        return self._batches_per_execution

    def next_item(self, device):
        """The next batch on the device, or None when the loader is exhausted."""
        if self._done:
            return None
        if self._iterator is None:
            self._iterator = iter(self._cpu_loader)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._done = True
            return None
        return self.send_cpu_data_to_device(batch, device)

    def send_cpu_data_to_device(self, batch, device):
        """``batch`` on the device, laid out by ``input_sharding``."""
        out = xm.send_cpu_data_to_device(batch, device, self._input_sharding)
        if type(batch) is torch.Tensor:  # send_cpu_data_to_device returns a one-element list
            return out[0]
        return out

    def close(self):
        self._done = True
        self._iterator = None


class MpDeviceLoader(object):
    """``ParallelLoader(loader, [device], **kwargs).per_device_loader(device)``, re-created for
    each iteration (one pass over ``loader`` per ``for`` loop), as in PyTorch/XLA.

    Example::

      >>> loader = pl.MpDeviceLoader(train_loader, xm.xla_device(),
      ...                            input_sharding=xs.ShardingSpec(mesh, ('data', None)))
      >>> for x, y in loader:   # x, y sharded over 'data' on dim 0
      ...     ...
    """

    def __init__(self, loader, device, **kwargs):
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs

    def __iter__(self):
        parallel_loader = ParallelLoader(self._loader, [self._device],
                                         **self._parallel_loader_kwargs)
        return parallel_loader.per_device_loader(self._device)

    def __len__(self):
        return len(self._loader)


def _as_spmd_device(d) -> torch.device:
    d = torch.device(d)
    if d.type in ("xla", _spmd_device().type):
        return _spmd_device()
    raise ValueError(f"torch_spmd loaders send data to the spmd device, got {d}")
