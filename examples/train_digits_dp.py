"""Data-parallel training of a handwritten-digit classifier with sharding annotations.

The 8x8 digits of ``sklearn.datasets.load_digits`` (1797 images, bundled with scikit-learn, no
download) train a small MLP on the spmd device. Data parallelism is one annotation: each batch
is uploaded split along its batch dim over the mesh axis 'data' (``input_sharding``), the
parameters stay replicated, and the partitioner inserts the gradient all-reduces.

  PYTHONPATH=. python3 examples/train_digits_dp.py            # ~1 minute on 2 cores
  PYTHONPATH=. python3 examples/train_digits_dp.py --epochs 2 --devices 4
"""
import argparse
import os
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all devices)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--devices", type=int, default=None,
                   help="emulated devices (default: $SPMD_NUM_DEVICES, else 8)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.devices:  # read by torch_spmd when it creates the devices, so set it before
        os.environ["SPMD_NUM_DEVICES"] = str(args.devices)

    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from tqdm import tqdm

    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr

    torch.manual_seed(args.seed)
    xr.use_spmd()
    dev = torch_spmd.device()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    # Inputs and labels split along the batch dim; everything else is replicated.
    input_sharding = xs.ShardingSpec(mesh, ("data", None))
    label_sharding = xs.ShardingSpec(mesh, ("data",))

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    n_test = len(x) // 5
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    steps_per_epoch = len(train_idx) // args.batch_size  # full batches only: one compiled step

    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    print(f"{n} emulated devices, mesh {dict(mesh.shape())}; {len(train_idx)} train / "
          f"{n_test} test images, batch {args.batch_size} ({args.batch_size // n} per device)")
    start = time.time()
    bar = tqdm(total=args.epochs * steps_per_epoch, desc="train", unit="step")
    for epoch in range(args.epochs):
        order = train_idx[torch.randperm(len(train_idx),
                                         generator=torch.Generator().manual_seed(epoch))]
        for i in range(steps_per_epoch):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            xb, = xm.send_cpu_data_to_device(x[idx], dev, input_sharding=input_sharding)
            yb, = xm.send_cpu_data_to_device(y[idx], dev, input_sharding=label_sharding)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            xm.optimizer_step(opt)  # a plain opt.step() in SPMD mode: one replica
            xm.mark_step()
            bar.update(1)
            if i == steps_per_epoch - 1:
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.4f}")
    bar.close()
    # What data parallelism cost per step: the gradient all-reduces over 'data'.
    kinds = {}
    for c in torch_spmd.debug.last_step_stats()["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(f"collectives per training step: {kinds}")

    with torch.no_grad():
        xt, = xm.send_cpu_data_to_device(x[test_idx], dev, input_sharding=input_sharding)
        predicted = model(xt).argmax(dim=-1).cpu()
    accuracy = (predicted == y[test_idx]).float().mean().item()
    print(f"trained {args.epochs} epochs in {time.time() - start:.1f}s")
    print(f"final test accuracy: {accuracy:.4f} ({int(accuracy * n_test)}/{n_test})")
    return accuracy


if __name__ == "__main__":
    main()
