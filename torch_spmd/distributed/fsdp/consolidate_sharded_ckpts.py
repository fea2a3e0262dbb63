"""Command line: consolidate sharded FSDP checkpoints into one full model checkpoint.

    python3 -m torch_spmd.distributed.fsdp.consolidate_sharded_ckpts \\
        --ckpt_prefix /tmp/run/final_ckpt --ckpt_suffix "_rank-*-of-*.pth" [--save_path S]
"""
from argparse import ArgumentParser

from .state_dict_utils import consolidate_sharded_model_checkpoints


def main(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ckpt_prefix", type=str, required=True,
        help="The path prefix of the XLA FSDP checkpoint files to be consolidated. "
        "Files matching the pattern ``ckpt_prefix + ckpt_suffix`` will be loaded.")
    parser.add_argument(
        "--ckpt_suffix", type=str, default="*.pth",
        help="The path suffix of the XLA FSDP checkpoint files to be consolidated. "
        "Files matching the pattern ``ckpt_prefix + ckpt_suffix`` will be loaded.")
    parser.add_argument(
        "--save_path", type=str, default="",
        help="The save path of the output consolidated model state dict "
        "(default is ``ckpt_prefix + '_consolidated.pth'``)")
    args = parser.parse_args(argv)
    consolidate_sharded_model_checkpoints(args.ckpt_prefix, args.ckpt_suffix, args.save_path)


if __name__ == "__main__":
    main()
