"""Consolidating the per-rank sharded FSDP checkpoints into one full state dict for the
unwrapped module (PyTorch/XLA's ``torch_xla.distributed.fsdp.state_dict_utils``)."""
from collections import OrderedDict
from glob import glob

import torch


def _numel(shape):
    numel = 1
    for d in shape:
        numel *= d
    return numel


def _consolidate_param(state_dict_list, shard_metadata, name, prefix, suffix):
    """Concatenates the ranks' shards of ``name``, drops the padding, restores the shape."""
    p_info = shard_metadata["shard_info"][prefix][suffix]
    orig_name, orig_size = p_info["_orig_name"], p_info["_orig_size"]
    full_param = torch.cat([sd[name] for sd in state_dict_list], dim=0)
    if full_param.dim() == 1:
        full_param = full_param[:_numel(orig_size)].view(*orig_size)
    else:  # sharded by rows (shard_param_on_dim_0=True)
        full_param = full_param[:orig_size[0]]
    full_name = orig_name if prefix == "" else prefix + "." + orig_name
    return full_param, full_name


def _unflatten_param(p, metadata, prefix):
    """Cuts a flat parameter back into the named original parameters."""
    param_names, param_shapes, param_numels = metadata
    full_params = [t.view(s) for t, s in zip(p.split(param_numels), param_shapes)]
    full_names = param_names if prefix == "" else [prefix + "." + n for n in param_names]
    return full_params, full_names


def consolidate_sharded_state_dicts(state_dict_list, shard_metadata):
    """The full state dict of the unwrapped module, from ``state_dict_list`` (every rank's
    ``model.state_dict()``, **sorted by rank**) and ``shard_metadata``
    (``model.get_shard_metadata()`` of any rank). Buffers come from rank 0, in their original
    dtype."""
    assert len(state_dict_list) == shard_metadata["world_size"]
    full_state_dict = OrderedDict()
    buffer_info = shard_metadata.get("buffer_info", {})
    for name, p in state_dict_list[0].items():
        if name in buffer_info:
            p = p.to(buffer_info[name]["_orig_dtype"])
        parts = name.split(".")
        shard_at = next((i for i, part in enumerate(parts) if part.startswith("_fsdp_shard")),
                        None)
        if shard_at is not None:
            prefix, suffix = ".".join(parts[:shard_at]), ".".join(parts[shard_at:])
            full_param, full_name = _consolidate_param(state_dict_list, shard_metadata, name,
                                                       prefix, suffix)
        else:
            full_param, full_name = p, name
        full_state_dict[full_name] = full_param
    flatten_info = shard_metadata["flatten_info"]
    for name in list(full_state_dict):
        if "_fsdp_wrapped_module.flat_param_" in name:
            p = full_state_dict.pop(name)
            prefix = ".".join(name.split(".")[:-1])
            for fp, fn in zip(*_unflatten_param(p, flatten_info[name], prefix)):
                full_state_dict[fn] = fp
    return OrderedDict(
        (k.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", ""), v)
        for k, v in full_state_dict.items())


def consolidate_sharded_model_checkpoints(ckpt_prefix, ckpt_suffix="*.pth", save_path="",
                                          save_model=True):
    """Loads every file matching ``ckpt_prefix + ckpt_suffix`` (each a dict with ``'model'``:
    that rank's ``model.state_dict()`` and ``'shard_metadata'``), checks that they are one
    complete set of ranks, consolidates them and (if ``save_model``) saves ``{'model': sd}`` to
    ``save_path`` or ``ckpt_prefix + '_consolidated.pth'``.

    Returns ``(full_state_dict, actual_save_path)`` (the path is None without saving).
    """
    ckpt_path_pattern = ckpt_prefix + ckpt_suffix
    ckpt_paths = glob(ckpt_path_pattern)
    assert len(ckpt_paths) > 0, f"Cannot find any files matching {ckpt_path_pattern}."
    print(f"found {len(ckpt_paths)} checkpoint files in {ckpt_path_pattern}")
    checkpoints_and_paths = [(torch.load(path, map_location="cpu"), path) for path in ckpt_paths]
    checkpoints_and_paths.sort(key=lambda c: c[0]["shard_metadata"]["rank"])
    checkpoints = [c[0] for c in checkpoints_and_paths]
    for rank, (ckpt, path) in enumerate(checkpoints_and_paths):
        assert ckpt["shard_metadata"]["world_size"] == len(checkpoints), (
            f'Expecting {ckpt["shard_metadata"]["world_size"]} files '
            f"(based on metadata in {path}) but got {len(checkpoints)} files. "
            f"Please check if you have missing or unexpected files in {ckpt_path_pattern}.")
        assert ckpt["shard_metadata"]["rank"] == rank, (
            f'Expecting rank {ckpt["shard_metadata"]["rank"]} for {path} but it is '
            f"ranked {rank} (out of {len(checkpoints)} files). "
            f"Please check if you have missing or unexpected files in {ckpt_path_pattern}.")
    full_state_dict = consolidate_sharded_state_dicts([c["model"] for c in checkpoints],
                                                      checkpoints[0]["shard_metadata"])
    actual_save_path = None
    if save_model:
        actual_save_path = save_path if save_path else ckpt_prefix + "_consolidated.pth"
        torch.save({"model": full_state_dict}, actual_save_path)
        print(f"saved consolidated model to {actual_save_path}")
    return full_state_dict, actual_save_path
