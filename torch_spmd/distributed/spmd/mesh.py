"""Logical device meshes: ``Mesh``, ``HybridMesh``, ``get_1d_mesh`` and the global mesh.

Same constructors, validation order, messages and exception types as PyTorch/XLA's
``torch_xla.distributed.spmd.xla_sharding`` (AssertionError where it asserts).
"""
import ast
from collections import OrderedDict
from typing import List, Optional, Tuple, Union

import numpy as np

from ... import _C
from ... import runtime as xr
from . import _partition_spec


class Mesh:
    """A logical mesh of the emulated devices.

    Args:
      device_ids: every device id, in the order that fills ``mesh_shape`` row-major.
      mesh_shape: the size of each mesh axis; the product must be the number of devices
        (a mesh always spans all devices, as in PyTorch/XLA).
      axis_names: optional unique names of the axes, usable in partition specs.

    Example::

      >>> mesh = Mesh(np.arange(8), (4, 2), ('data', 'model'))
      >>> mesh.shape()
      OrderedDict([('data', 4), ('model', 2)])
    """

    device_ids: np.ndarray
    mesh_shape: Tuple[int, ...]
    axis_names: Optional[Tuple[str, ...]]

    def __init__(self,
                 device_ids: Union[np.ndarray, List[int]],
                 mesh_shape: Tuple[int, ...],
                 axis_names: Optional[Tuple[str, ...]] = None):
        if not isinstance(device_ids, np.ndarray):
            device_ids = np.array(device_ids)
        # A mesh must cover every device (no submeshes), as in PyTorch/XLA.
        num_devices = xr.global_runtime_device_count()
        assert num_devices > 0, "This requires XLA supported device(s)."
        assert num_devices == len(device_ids), \
            (f"Number of device IDs ({len(device_ids)}) must match the global number of devices "
             f"({num_devices})")
        if axis_names is not None:
            assert len(mesh_shape) == len(axis_names), \
                (f"Number of axis names ({len(axis_names)}) must match mesh dimensions "
                 f"({len(mesh_shape)})")
            assert len(set(axis_names)) == len(axis_names), \
                f"Axis names must be unique, got: {axis_names}"
        expected_devices = np.prod(mesh_shape)
        assert len(device_ids) == expected_devices, \
            f"Number of device IDs ({len(device_ids)}) must match mesh size ({expected_devices})"
        assert len(device_ids) == len(np.unique(device_ids)), \
            f"Device IDs must be unique, got: {device_ids}"
        # Normalized to tuples of Python ints so that the mesh hashes, prints and round-trips
        # through __str__/from_str the same way whatever sequence type it was given.
        self.device_ids = device_ids
        self.mesh_shape = tuple(int(s) for s in mesh_shape)
        self.axis_names = tuple(axis_names) if axis_names is not None else None
        assert all(d < self.size() for d in device_ids), \
            f"Device IDs must be less than mesh size ({self.size()}), got: {device_ids}"

    def size(self):
        """Number of devices in the mesh."""
        return np.prod(self.mesh_shape)

    def shape(self) -> "OrderedDict":
        """Axis name (or index, if unnamed) -> axis size, in axis order."""
        if self.axis_names is None:
            return OrderedDict((dim, size) for dim, size in enumerate(self.mesh_shape))
        return OrderedDict((name, size) for name, size in zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids laid out in the mesh shape."""
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> Optional[int]:
        """Index of the axis called ``name``, or None (also on an unnamed mesh, where
        PyTorch/XLA raises TypeError)."""
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def get_op_sharding(self, partition_spec) -> str:
        """The sharding ``partition_spec`` describes on this mesh, in XLA text form
        (e.g. ``{devices=[4,2]0,1,2,3,4,5,6,7}``). PyTorch/XLA returns an OpSharding object;
        the text is what this implementation exchanges with its C++ layer."""
        return _C._sharding_spec_for(*self._sharding_args(partition_spec))

    def _sharding_args(self, partition_spec) -> tuple:
        """The arguments of ``_C._mark_sharding`` after the tensor, for a validated spec."""
        dim_axes = _partition_spec.to_dim_axes(self, partition_spec)
        return ([int(d) for d in self.device_ids], list(self.mesh_shape),
                list(self.axis_names or ()), dim_axes)

    def __str__(self) -> str:
        return (f"{{'device_ids': {self.device_ids.tolist()}, "
                f"'mesh_shape': {self.mesh_shape}, "
                f"'axis_names': {self.axis_names}}}")

    def __repr__(self) -> str:
        return f"Mesh({self})"

    @classmethod
    def from_str(cls, mesh_str: str) -> Optional["Mesh"]:
        """Inverse of ``__str__`` (also accepts ``repr``); None if the text does not parse."""
        try:
            mesh_dict = ast.literal_eval(mesh_str.replace("Mesh", ""))
            return cls(device_ids=np.array(mesh_dict['device_ids']),
                       mesh_shape=mesh_dict['mesh_shape'],
                       axis_names=mesh_dict['axis_names'])
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None

    def _key(self) -> tuple:
        return (tuple(int(d) for d in self.device_ids), self.mesh_shape, self.axis_names)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


_GLOBAL_MESH: Optional[Mesh] = None


def set_global_mesh(mesh: Mesh) -> None:
    """Sets the mesh that APIs taking an optional mesh default to."""
    global _GLOBAL_MESH
    _GLOBAL_MESH = mesh


def get_global_mesh() -> Optional[Mesh]:
    """The mesh set by ``set_global_mesh``, or None."""
    return _GLOBAL_MESH


def get_1d_mesh(axis_name: Optional[str] = None) -> Mesh:
    """A mesh with every device along one axis (optionally named ``axis_name``)."""
    num_devices = xr.global_runtime_device_count()
    device_ids = np.arange(num_devices)
    if axis_name is None:
        return Mesh(device_ids, (num_devices,))
    return Mesh(device_ids, (num_devices,), (axis_name,))


class HybridMesh(Mesh):
    """A mesh over slices: devices connected by a fast network (ICI) inside a slice and a slow
    one (DCN) between slices. ``mesh_shape = ici_mesh_shape * dcn_mesh_shape`` elementwise.

    The emulated devices have no physical coordinates, so a slice is a block of
    ``prod(ici_mesh_shape)`` consecutive device ids (slice ``s`` holds ids
    ``s*k .. s*k+k-1``), laid out row-major over ``ici_mesh_shape``. Along each mesh axis the dcn
    part is the most major: index ``i`` of axis ``a`` is ``dcn_coord * ici[a] + ici_coord``, so
    the devices of one slice share their dcn coordinates (as PyTorch/XLA's ``np.block`` layout).

    Keyword-only, as in PyTorch/XLA. Example (8 devices = 2 slices of 4)::

      >>> HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=('data', 'fsdp'))
    """

    ici_mesh_shape: Tuple[int, ...]
    dcn_mesh_shape: Tuple[int, ...]

    def __init__(self,
                 *,
                 ici_mesh_shape: Tuple[int, ...],
                 dcn_mesh_shape: Optional[Tuple[int, ...]] = None,
                 axis_names: Optional[Tuple[str, ...]] = None):
        if dcn_mesh_shape is None:
            dcn_mesh_shape = tuple([1] * len(ici_mesh_shape))
        assert len(ici_mesh_shape) == len(dcn_mesh_shape)
        ici = tuple(int(x) for x in ici_mesh_shape)
        dcn = tuple(int(x) for x in dcn_mesh_shape)
        mesh_shape = tuple(x * y for x, y in zip(ici, dcn))
        self.ici_mesh_shape = ici
        self.dcn_mesh_shape = dcn
        num_devices = xr.global_runtime_device_count()
        slice_size = int(np.prod(ici))
        divides = slice_size > 0 and num_devices % slice_size == 0
        num_slices = num_devices // slice_size if divides else 0
        multislice = num_slices > 1
        if multislice and np.prod(dcn) == 1:
            raise ValueError('Provide dcn_mesh_shape to create a mesh for multislice')
        if num_slices == 1 and np.prod(dcn) > 1:
            raise ValueError('Invalid dcn_mesh_shape for single slice mesh')
        if num_slices == 0:  # the ici shape does not tile the devices into slices
            shape = ici if np.prod(dcn) == 1 else mesh_shape
            raise ValueError(f'Number of devices {num_devices} must equal the product '
                             f'of mesh_shape {shape}')
        if np.prod(dcn) != num_slices:
            raise ValueError(f'Number of slices {num_slices} must equal the product of '
                             f'dcn_mesh_shape {dcn}')
        self.device_attributes = [
            dict(attr, slice_index=attr['ordinal'] // slice_size)
            for attr in xr.global_runtime_device_attributes()
        ]
        super().__init__(_hybrid_layout(ici, dcn).flatten(), mesh_shape, axis_names)


def _hybrid_layout(ici: Tuple[int, ...], dcn: Tuple[int, ...]) -> np.ndarray:
    """Device ids in the hybrid mesh shape: slice-major ids, each axis dcn-major."""
    rank = len(ici)
    # Ids indexed [dcn coords..., ici coords...] (slice index = row-major dcn coords), then
    # interleaved to [dcn_0, ici_0, dcn_1, ici_1, ...] and merged pairwise.
    ids = np.arange(int(np.prod(ici)) * int(np.prod(dcn))).reshape(dcn + ici)
    order = [i for a in range(rank) for i in (a, rank + a)]
    return ids.transpose(order).reshape(tuple(x * y for x, y in zip(ici, dcn)))
